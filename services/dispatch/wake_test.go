package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestWakingNoHeldJobsMakesNoConsumer: an account edit wakes the held jobs
// of every account of its channel; an account with none costs no consumer
// (with 1,000 accounts each edit made and removed a thousand), and one
// with a held job still has it put back in its queue.
func TestWakingNoHeldJobsMakesNoConsumer(t *testing.T) {
	js := topologytest.Start(t).JS
	svc := runService(t, js, Config{Logger: logtest.Logger()})
	select {
	case <-svc.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("dispatch not ready")
	}
	var created atomic.Int64
	sub, err := js.Conn().Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED."+contract.StreamJobs+".>", func(*nats.Msg) { created.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, js.Conn().Flush())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 200 {
		n, err := svc.wakeHeld(ctx, fmt.Sprintf("idle-%d", i))
		require.NoError(t, err)
		require.Zero(t, n)
	}
	require.NoError(t, js.Conn().Flush())
	time.Sleep(100 * time.Millisecond) // advisories of anything made would have come
	require.Zero(t, created.Load(), "consumers made to find no held job")

	job := contract.Job{ID: contract.JobID("wake", 0, false), TaskID: "wake", To: "user-0", Body: "hi",
		Channel: "sandbox", Account: "held-1", Priority: contract.PriorityNormal, MaxAttempts: 3}
	data, err := contract.EncodeJob(&job)
	require.NoError(t, err)
	_, err = js.Publish(ctx, contract.HeldSubject("held-1", job.ID), data)
	require.NoError(t, err)
	n, err := svc.wakeHeld(ctx, "held-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Eventually(t, func() bool { return created.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "one consumer to take the held job")
	jobs, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	_, err = jobs.GetLastMsgForSubject(ctx, contract.HeldFilter("held-1"))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the held job was taken")
	m, err := jobs.GetLastMsgForSubject(ctx, contract.JobSubject("held-1", contract.PriorityNormal))
	require.NoError(t, err, "the job is back in its account's queue")
	require.Equal(t, data, m.Data)
}
