package shared

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TopologyStream is one stream of the topology as CheckTopology requires
// it: the properties the services rely on. What `broadcast setup` chooses
// for a deployment (replicas, ages, sizes) is not part of it: a service
// knows no better than the setup that chose them.
type TopologyStream struct {
	// Kind is "stream", "KV bucket" or "object store"; Name is its name.
	Kind, Name string
	// Stream is the name of the stream itself: TASKS, KV_broadcast_tasks,
	// OBJ_broadcast_status.
	Stream string
	// Subjects the stream must capture, in any order.
	Subjects []string
	// Retention is its retention policy: a work queue or limits.
	Retention jetstream.RetentionPolicy
	// AllowMsgSchedules is set on the streams that hold scheduled messages.
	AllowMsgSchedules bool
	// History is how many values per key a KV bucket keeps; 0 for other
	// streams.
	History int64
}

// WorkQueue reports whether the stream is a work queue (each message is
// removed once acknowledged) rather than history.
func (s TopologyStream) WorkQueue() bool { return s.Retention == jetstream.WorkQueuePolicy }

// TopologyStreams lists every stream of the topology: the streams, then
// those of the KV buckets and of the object stores.
func TopologyStreams() []TopologyStream {
	var out []TopologyStream
	for _, sc := range Streams(TopologyConfig{}) {
		out = append(out, TopologyStream{Kind: "stream", Name: sc.Name, Stream: sc.Name, Subjects: sc.Subjects,
			Retention: sc.Retention, AllowMsgSchedules: sc.AllowMsgSchedules})
	}
	for _, kc := range Buckets(TopologyConfig{}) {
		out = append(out, TopologyStream{Kind: "KV bucket", Name: kc.Bucket, Stream: KVStream(kc.Bucket),
			Subjects: []string{"$KV." + kc.Bucket + ".>"}, Retention: jetstream.LimitsPolicy, History: int64(max(1, kc.History))})
	}
	for _, oc := range ObjectStores(TopologyConfig{}) {
		out = append(out, TopologyStream{Kind: "object store", Name: oc.Bucket, Stream: ObjectStream(oc.Bucket),
			Subjects: []string{"$O." + oc.Bucket + ".C.>", "$O." + oc.Bucket + ".M.>"}, Retention: jetstream.LimitsPolicy})
	}
	return out
}

// TopologyError lists what is missing from the topology or differs from
// what the services need.
type TopologyError struct {
	// Problems are one line each, e.g. "stream TASKS is missing".
	Problems []string
}

func (e *TopologyError) Error() string {
	return "topology not in place (run `broadcast setup`): " + strings.Join(e.Problems, "; ")
}

// CheckTopology reads every stream of the topology and returns a
// *TopologyError naming each one that is missing or differs in what
// TopologyStream describes, or another error when the server could not
// answer. It changes nothing, so it needs only stream info grants.
func CheckTopology(ctx context.Context, js jetstream.JetStream) error {
	var problems []string
	for _, want := range TopologyStreams() {
		info, err := streamInfo(ctx, js, want.Stream)
		if err != nil {
			return fmt.Errorf("%s %s: %w", want.Kind, want.Name, err)
		}
		if info == nil {
			problems = append(problems, fmt.Sprintf("%s %s is missing", want.Kind, want.Name))
			continue
		}
		problems = append(problems, differences(want, info.Config)...)
	}
	if len(problems) > 0 {
		return &TopologyError{Problems: problems}
	}
	return nil
}

// differences describes how got differs from want, one line per property.
func differences(want TopologyStream, got jetstream.StreamConfig) []string {
	var out []string
	what := want.Kind + " " + want.Name
	if !slices.Equal(slices.Sorted(slices.Values(want.Subjects)), slices.Sorted(slices.Values(got.Subjects))) {
		out = append(out, fmt.Sprintf("%s has subjects %v, want %v", what, got.Subjects, want.Subjects))
	}
	if got.Retention != want.Retention {
		out = append(out, fmt.Sprintf("%s has retention %s, want %s", what, got.Retention, want.Retention))
	}
	if want.AllowMsgSchedules && !got.AllowMsgSchedules {
		out = append(out, what+" does not allow message schedules")
	}
	if want.History != 0 && got.MaxMsgsPerSubject != want.History {
		out = append(out, fmt.Sprintf("%s keeps %d values per key, want %d", what, got.MaxMsgsPerSubject, want.History))
	}
	return out
}

// TopologyWait is how long a service waits at start for the topology:
// under a Procfile runner `broadcast setup` starts beside the services,
// and after a server restart the streams take a moment to recover.
const TopologyWait = 2 * time.Minute

// WaitForTopology checks the topology until it is in place, wait has
// passed or ctx ends, logging what is missing when the first check fails
// and every 10 s after. The error names what was still missing or
// different at the last check.
func WaitForTopology(ctx context.Context, js jetstream.JetStream, wait time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(wait)
	var lastLog time.Time
	for {
		err := CheckTopology(ctx, js)
		if err == nil {
			if !lastLog.IsZero() {
				log.Info("topology in place")
			}
			return nil
		}
		if time.Since(lastLog) >= 10*time.Second {
			log.Warn("waiting for the topology", "err", err)
			lastLog = time.Now()
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("after waiting %s: %w", wait, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w while waiting for the topology: %w", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
