package harness

import (
	"context"
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
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// DispatchEnv is a server with ingest, render and status running, and
// dispatch replicas the test starts and stops one by one. The pipeline's own
// dispatch is given no channels, so it starts no account and the replicas
// are the only senders.
type DispatchEnv struct {
	t   *testing.T
	TS  *pipelinetest.Server
	cfg dispatch.Config

	mu       sync.Mutex
	replicas []*Replica
	sends    []ReplicaSend
}

// ReplicaSend is one provider call made by a replica.
type ReplicaSend struct {
	Replica int
	At      time.Time
	To      string
}

// Replica is one dispatch process: its own connection and context.
type Replica struct {
	ID     int
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// NewDispatchEnv starts a server and the pipeline without senders; cfg
// configures the replicas StartReplica adds.
func NewDispatchEnv(t *testing.T, cfg dispatch.Config) *DispatchEnv {
	t.Helper()
	ts := pipelinetest.Start(t)
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{Channels: channels.Registry{}}})
	return &DispatchEnv{t: t, TS: ts, cfg: cfg}
}

// StartReplica runs one more dispatch replica on its own connection.
func (e *DispatchEnv) StartReplica() *Replica {
	e.t.Helper()
	nc, err := nats.Connect(e.TS.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(e.t, err)
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	e.mu.Lock()
	r := &Replica{ID: len(e.replicas) + 1, nc: nc, done: make(chan struct{})}
	e.replicas = append(e.replicas, r)
	e.mu.Unlock()
	cfg := e.cfg
	cfg.Logger = logtest.Logger().With("replica", r.ID)
	cfg.Channels = channels.Registry{}
	for name, ch := range channels.Builtin() {
		cfg.Channels[name] = notingChannel{Channel: ch, note: func(to string) {
			e.mu.Lock()
			e.sends = append(e.sends, ReplicaSend{Replica: r.ID, At: time.Now(), To: to})
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
			e.t.Errorf("replica %d: %v", r.ID, err)
		}
	}()
	e.t.Cleanup(r.Stop)
	return r
}

// Stop cancels the replica, waits for its in-flight sends and closes its
// connection, as a process that exits does. Calling it twice is safe.
func (r *Replica) Stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
		r.nc.Close()
	})
}

// WaitAccountsApart waits until each account's lease is held, every one
// by a different replica: the fair share gives two replicas one account
// each only after the first has let one go, and a test that means to
// race replicas must not start while one holds them all.
func (e *DispatchEnv) WaitAccountsApart(accounts ...string) {
	e.t.Helper()
	natstest.Eventually(e.t, 30*time.Second, func() bool {
		owners := e.LeaseHolders(accounts...)
		distinct := map[string]bool{}
		for _, o := range owners {
			distinct[o] = true
		}
		return len(owners) == len(accounts) && len(distinct) == len(accounts)
	}, "each of %v held by its own replica", accounts)
}

// LeaseHolders returns who holds each held account's lease now.
func (e *DispatchEnv) LeaseHolders(accounts ...string) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, a := range accounts {
		if v, err := KVGet(e.t, e.TS, contract.BucketLeases, a); err == nil {
			out[a] = string(v.Value())
		}
	}
	return out
}

// SendLog returns every provider call the replicas made, in time order.
func (e *DispatchEnv) SendLog() []ReplicaSend {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := append([]ReplicaSend(nil), e.sends...)
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// SendCount is how many provider calls the replicas made.
func (e *DispatchEnv) SendCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sends)
}

// SendsBy counts the provider calls per replica.
func (e *DispatchEnv) SendsBy() map[int]int {
	out := map[int]int{}
	for _, s := range e.SendLog() {
		out[s.Replica]++
	}
	return out
}

// IssuePacing measures the moments the replicas' senders were called
// against a limit. A sender called late (a busy CPU between the pacer's
// admit and the call) shows here as a bunched start: assert the pacing on
// CallStartPacing, which reads the admit moments.
func (e *DispatchEnv) IssuePacing(limit int) PacingFigures {
	var hs []Hit
	for _, s := range e.SendLog() {
		hs = append(hs, Hit{At: s.At, To: s.To})
	}
	return MeasurePacing(hs, limit)
}

// CallStartPacing measures the sent events' call_started_at of the given
// tasks, the moments the pacer admitted their sends, against a limit.
func (e *DispatchEnv) CallStartPacing(limit int, taskIDs ...string) PacingFigures {
	var hs []Hit
	for _, id := range taskIDs {
		for _, ev := range e.TS.Events(e.t, id) {
			if ev.Kind == contract.EventSent {
				require.False(e.t, ev.CallStartedAt.IsZero(), "sent event of %s to %s has no call_started_at", id, ev.To)
				hs = append(hs, Hit{At: ev.CallStartedAt, To: ev.To})
			}
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].At.Before(hs[j].At) })
	return MeasurePacing(hs, limit)
}

// TransportDelays returns the median, 99th percentile and largest delay
// from a replica starting a send to the provider's handler seeing it, for
// recipients sent once.
func (e *DispatchEnv) TransportDelays(rec *Recorder) (p50, p99, worst time.Duration) {
	starts := map[string][]time.Time{}
	for _, s := range e.SendLog() {
		starts[s.To] = append(starts[s.To], s.At)
	}
	var ds []time.Duration
	for _, h := range rec.All() {
		if st := starts[h.To]; len(st) == 1 {
			ds = append(ds, h.At.Sub(st[0]))
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
