// Package client is the Go side of Broadcast's contract for operators and
// tests: submit a task, read and follow its progress, control it
// (client.go); read its dead letters (dead.go), its failures grouped and
// its events (failures.go), the accounts with their health (accounts.go)
// and a recipient's outcomes (lookup.go), all through readSubject
// (streamread.go). Everything it does can also be done with the nats CLI.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// Submit publishes a task on broadcast.tasks. When the task has an id it is
// also sent as Nats-Msg-Id, so a quick resubmission is dropped by the stream
// itself. It returns the task id ("" when the task has none: ingest then
// assigns a ULID).
func Submit(ctx context.Context, js jetstream.JetStream, task []byte) (string, error) {
	id := taskID(task)
	msg := nats.NewMsg(contract.SubjectTasks)
	msg.Data = task
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return "", fmt.Errorf("publish task: %w", err)
	}
	return id, nil
}

// taskID returns the task's top-level "id", reading only as far as it: a
// task with 200,000 inline recipients took a whole decode (a twentieth of
// a second) just for its id. Ingest validates the task; here anything
// unreadable just has no id.
func taskID(task []byte) string {
	dec := json.NewDecoder(bytes.NewReader(task))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return ""
		}
		if k, _ := key.(string); strings.EqualFold(k, "id") {
			var id string
			if dec.Decode(&id) != nil {
				return ""
			}
			return id
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

// ErrNoProgress is returned when a task has no progress value yet.
var ErrNoProgress = errors.New("no progress for this task yet")

// Get reads a task's progress.
func Get(ctx context.Context, js jetstream.JetStream, taskID string) (*contract.Progress, error) {
	kv, err := js.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNoProgress
	}
	if err != nil {
		return nil, err
	}
	var p contract.Progress
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return nil, fmt.Errorf("progress of %s: %w", taskID, err)
	}
	return &p, nil
}

// Follow calls fn with every progress update of the task until the task is
// final (returning its last progress) or ctx ends.
func Follow(ctx context.Context, js jetstream.JetStream, taskID string, fn func(*contract.Progress)) (*contract.Progress, error) {
	kv, err := js.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, taskID)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var last *contract.Progress
	for {
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return last, errors.New("progress watch closed")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var p contract.Progress
			if err := json.Unmarshal(e.Value(), &p); err != nil {
				continue
			}
			last = &p
			if fn != nil {
				fn(&p)
			}
			if p.State.Final() {
				return last, nil
			}
		}
	}
}

// Control sends a control request (pause, resume, cancel, retry-dead) for a
// task and returns the reply. A refused request returns the reply and an
// error carrying its message. While no service answers the subject (ingest
// is starting or still reconnecting after a server restart) the request is
// sent again until ctx ends: no responder means nobody acted on it.
func Control(ctx context.Context, nc *nats.Conn, taskID, action string) (*contract.ControlReply, error) {
	return ControlRequest(ctx, nc, taskID, contract.ControlRequest{Action: action})
}

// ControlRequest sends a control request with every field (a retry-dead of
// a selection names its dead letters in Seqs), like Control.
func ControlRequest(ctx context.Context, nc *nats.Conn, taskID string, r contract.ControlRequest) (*contract.ControlReply, error) {
	action := r.Action
	req, _ := json.Marshal(r)
	msg, err := RequestAnswered(ctx, nc, contract.ControlSubject(taskID), req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", action, taskID, err)
	}
	var reply contract.ControlReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("%s %s: bad reply: %w", action, taskID, err)
	}
	if !reply.OK {
		return &reply, fmt.Errorf("%s %s: %s", action, taskID, reply.Error)
	}
	return &reply, nil
}

// RequestAnswered sends a request, again after a growing pause (100 ms up
// to 1 s) each time the server says nobody listens, until ctx ends. Then
// the last error is returned; it is nats.ErrNoResponders too when ctx
// ended during a later try (nobody answered any of them).
func RequestAnswered(ctx context.Context, nc *nats.Conn, subject string, data []byte) (*nats.Msg, error) {
	wait := 100 * time.Millisecond
	for tries := 0; ; tries++ {
		msg, err := nc.RequestWithContext(ctx, subject, data)
		if tries > 0 && err != nil && ctx.Err() != nil && !errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w, before that: %w", err, nats.ErrNoResponders)
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			return msg, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// List returns the progress of every task, most recently created first.
func List(ctx context.Context, js jetstream.JetStream) ([]*contract.Progress, error) {
	kv, err := js.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []*contract.Progress
	for key := range lister.Keys() {
		if p, err := Get(ctx, js, key); err == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}
