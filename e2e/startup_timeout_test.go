package e2e

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/feedback"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
)

// timingOutJS is a service's JetStream whose first requests for buckets,
// object stores, streams and consumers time out, as they do while
// nats-server restarts.
type timingOutJS struct {
	jetstream.JetStream
	left     atomic.Int32 // requests still to time out
	timedOut atomic.Int32
}

func newTimingOutJS(js jetstream.JetStream, n int) *timingOutJS {
	t := &timingOutJS{JetStream: js}
	t.left.Store(int32(n))
	return t
}

func (t *timingOutJS) fail() error {
	if t.left.Add(-1) >= 0 {
		t.timedOut.Add(1)
		return context.DeadlineExceeded
	}
	return nil
}

func (t *timingOutJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	if err := t.fail(); err != nil {
		return nil, err
	}
	return t.JetStream.KeyValue(ctx, bucket)
}

func (t *timingOutJS) ObjectStore(ctx context.Context, bucket string) (jetstream.ObjectStore, error) {
	if err := t.fail(); err != nil {
		return nil, err
	}
	return t.JetStream.ObjectStore(ctx, bucket)
}

func (t *timingOutJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if err := t.fail(); err != nil {
		return nil, err
	}
	return t.JetStream.Stream(ctx, name)
}

func (t *timingOutJS) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if err := t.fail(); err != nil {
		return nil, err
	}
	return t.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
}

// TestServicesStartThroughTimeouts: every service whose first start
// requests time out (a server restarting as it starts) keeps trying each
// step and starts, instead of exiting (multi-process scenario seed
// 956785183 lost render that way); then a task goes through them all.
func TestServicesStartThroughTimeouts(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "sbx", `{"channel":"sandbox","rate_per_sec":1000,"burst":100,"concurrency":8}`)
	log := logtest.Logger()
	const timeouts = 3
	js := map[string]*timingOutJS{}
	for _, name := range []string{"ingest", "render", "dispatch", "status", "feedback"} {
		_, real := ts.ConnectAs(t, ts.Creds)
		js[name] = newTimingOutJS(real, timeouts)
	}
	in, err := ingest.New(js["ingest"], ingest.Config{Logger: log})
	require.NoError(t, err)
	re, err := render.New(js["render"], render.Config{Logger: log})
	require.NoError(t, err)
	di, err := dispatch.New(js["dispatch"], dispatch.Config{Logger: log})
	require.NoError(t, err)
	st, err := status.New(js["status"], status.Config{Logger: log})
	require.NoError(t, err)
	fb, err := feedback.New(js["feedback"], feedback.Config{Addr: "127.0.0.1:0", Logger: log})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stopped := make(chan string, 5)
	for name, svc := range map[string]interface{ Run(context.Context) error }{"ingest": in, "render": re, "dispatch": di, "status": st, "feedback": fb} {
		wg.Go(func() {
			if err := svc.Run(ctx); err != nil {
				t.Errorf("%s stopped: %v", name, err)
			}
			stopped <- name
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	task := contract.Task{ID: "starts-1", Channel: "sandbox", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("user", 40)}
	data, err := json.Marshal(task)
	require.NoError(t, err)
	_, err = client.Submit(ctx, ts.JS, data)
	require.NoError(t, err)
	p := ts.WaitFinal(t, task.ID, time.Minute)
	require.Equal(t, contract.StateSucceeded, p.State, "progress: %+v", p)
	require.Equal(t, 40, p.Sent)
	require.NotEmpty(t, fb.Addr(), "feedback listens")
	select {
	case name := <-stopped:
		t.Fatalf("%s stopped while the others ran", name)
	default:
	}
	for name, j := range js {
		require.Equal(t, int32(timeouts), j.timedOut.Load(), "%s's start requests timed out", name)
	}
}
