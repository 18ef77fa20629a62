package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// dispatchEnv is a server with ingest, render and status running, and
// dispatch replicas the test starts and stops one by one. The pipeline's own
// dispatch is given no channels, so it starts no account and the replicas
// are the only senders.
type dispatchEnv struct {
	t   *testing.T
	ts  *pipelinetest.Server
	cfg dispatch.Config

	mu       sync.Mutex
	replicas []*replica
	sends    []replicaSend
}

// replicaSend is one provider call made by a replica.
type replicaSend struct {
	replica int
	at      time.Time
	to      string
}

// replica is one dispatch process: its own connection and context.
type replica struct {
	id     int
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func newDispatchEnv(t *testing.T, cfg dispatch.Config) *dispatchEnv {
	t.Helper()
	ts := pipelinetest.Start(t)
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{Channels: channels.Registry{}}})
	return &dispatchEnv{t: t, ts: ts, cfg: cfg}
}

// startReplica runs one more dispatch replica on its own connection.
func (e *dispatchEnv) startReplica() *replica {
	e.t.Helper()
	nc, err := nats.Connect(e.ts.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(e.t, err)
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	e.mu.Lock()
	r := &replica{id: len(e.replicas) + 1, nc: nc, done: make(chan struct{})}
	e.replicas = append(e.replicas, r)
	e.mu.Unlock()
	cfg := e.cfg
	cfg.Logger = logtest.Logger().With("replica", r.id)
	cfg.Channels = channels.Registry{}
	for name, ch := range channels.Builtin() {
		cfg.Channels[name] = notingChannel{Channel: ch, note: func(to string) {
			e.mu.Lock()
			e.sends = append(e.sends, replicaSend{replica: r.id, at: time.Now(), to: to})
			e.mu.Unlock()
		}}
	}
	svc, err := dispatch.New(js, cfg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		if err := svc.Run(ctx); err != nil {
			e.t.Errorf("replica %d: %v", r.id, err)
		}
	}()
	e.t.Cleanup(r.stop)
	return r
}

// stop cancels the replica, waits for its in-flight sends and closes its
// connection, as a process that exits does. Calling it twice is safe.
func (r *replica) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
		r.nc.Close()
	})
}

// sendLog returns every provider call the replicas made, in time order.
func (e *dispatchEnv) sendLog() []replicaSend {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := append([]replicaSend(nil), e.sends...)
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// sendsBy counts the provider calls per replica.
func (e *dispatchEnv) sendsBy() map[int]int {
	out := map[int]int{}
	for _, s := range e.sendLog() {
		out[s.replica]++
	}
	return out
}

// issuePacing measures the replicas' send starts (the dispatch side, before
// any transport delay) against a limit.
func (e *dispatchEnv) issuePacing(limit int) pacingFigures {
	var hs []hit
	for _, s := range e.sendLog() {
		hs = append(hs, hit{at: s.at, to: s.to})
	}
	return measurePacing(hs, limit)
}

// transportDelays returns the median, 99th percentile and largest delay
// from a replica starting a send to the provider's handler seeing it, for
// recipients sent once.
func (e *dispatchEnv) transportDelays(rec *recorder) (p50, p99, worst time.Duration) {
	starts := map[string][]time.Time{}
	for _, s := range e.sendLog() {
		starts[s.to] = append(starts[s.to], s.at)
	}
	var ds []time.Duration
	for _, h := range rec.all() {
		if st := starts[h.to]; len(st) == 1 {
			ds = append(ds, h.at.Sub(st[0]))
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
}

// notingChannel is a channel whose senders note every call before making it,
// so a test knows which replica sent what.
type notingChannel struct {
	channels.Channel
	note func(to string)
}

func (c notingChannel) NewSender(a *contract.Account, getenv func(string) string) (channels.Sender, error) {
	s, err := c.Channel.NewSender(a, getenv)
	if err != nil {
		return nil, err
	}
	return notingSender{Sender: s, note: c.note}, nil
}

type notingSender struct {
	channels.Sender
	note func(to string)
}

func (s notingSender) Send(ctx context.Context, msgs []channels.Message) []channels.Result {
	for _, m := range msgs {
		s.note(m.To)
	}
	return s.Sender.Send(ctx, msgs)
}

// webhookAccount is an account JSON for a webhook endpoint with extra fields.
func webhookAccount(endpoint string, fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return fmt.Sprintf(`{"channel":"webhook","endpoint":%q%s}`, endpoint, fields)
}

// recipients builds n recipients named prefix-0000, prefix-0001, ...
func recipients(prefix string, n int) []contract.Recipient {
	out := make([]contract.Recipient, n)
	for i := range out {
		out[i] = contract.Recipient{To: fmt.Sprintf("%s-%04d", prefix, i)}
	}
	return out
}

// waitCount polls until count() reaches want or timeout passes.
func waitCount(t *testing.T, timeout time.Duration, want int, count func() int, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var n int
	for time.Now().Before(deadline) {
		if n = count(); n >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.FailNowf(t, "timed out", "%s: %d of %d after %s", what, n, want, timeout)
}

// eventsOf filters events by kind.
func eventsOf(evs []contract.Event, kind contract.EventKind) []contract.Event {
	var out []contract.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// kvGet reads a key of a bucket.
func kvGet(t *testing.T, ts *pipelinetest.Server, bucket, key string) (jetstream.KeyValueEntry, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, bucket)
	require.NoError(t, err)
	return kv.Get(ctx, key)
}

// accountHealth reads an account's health value, or nil.
func accountHealth(t *testing.T, ts *pipelinetest.Server, name string) *contract.AccountHealth {
	t.Helper()
	e, err := kvGet(t, ts, contract.BucketHealth, name)
	if err != nil {
		return nil
	}
	var h contract.AccountHealth
	require.NoError(t, json.Unmarshal(e.Value(), &h))
	return &h
}
