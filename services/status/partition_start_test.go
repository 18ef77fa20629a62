package status_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// TestNewPartitionsStartWhereTheFoldStopped: after a status with one
// partition has folded every event, a status with four starts each new
// partition consumer after the last folded event, not at the beginning of
// EVENTS (a month of events folded again), partitions made after the
// first included.
func TestNewPartitionsStartWhereTheFoldStopped(t *testing.T) {
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 50
	for i := range n {
		data, err := contract.EncodeEvent(&contract.Event{TaskID: "migrate", JobID: fmt.Sprintf("migrate.%d", i), To: "+15550000000",
			Account: "a", Kind: contract.EventSent, Index: i, Attempt: 1, At: time.Now().UTC()})
		require.NoError(t, err)
		_, err = ts.JS.Publish(ctx, contract.EventSubject("migrate", contract.EventSent), data)
		require.NoError(t, err)
	}
	stream, err := ts.JS.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	last := stream.CachedInfo().State.LastSeq
	require.EqualValues(t, n, last)

	run := func(partitions int, until func() bool) {
		svc, err := status.New(ts.JS, status.Config{Partitions: partitions, Logger: logtest.Logger()})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- svc.Run(rctx) }()
		natstest.Eventually(t, 20*time.Second, until)
		stop()
		require.NoError(t, <-done)
	}
	consumer := func(name string) *jetstream.ConsumerInfo {
		c, err := stream.Consumer(ctx, name)
		if err != nil {
			return nil
		}
		return c.CachedInfo()
	}
	run(1, func() bool { i := consumer(contract.ConsumerStatus); return i != nil && i.AckFloor.Stream == last }) // acked: it folds
	leases, err := ts.JS.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	// Stopped once it folds every partition, not while it still starts.
	run(4, func() bool {
		for k := range 4 {
			if _, err := leases.Get(ctx, status.FoldLeaseKey(k, 4)); err != nil {
				return false
			}
		}
		return true
	})
	for k := range 4 {
		i := consumer(fmt.Sprintf("status-%d-of-4", k))
		require.NotNil(t, i, "partition %d", k)
		require.Equal(t, jetstream.DeliverByStartSequencePolicy, i.Config.DeliverPolicy, "partition %d", k)
		require.Equal(t, last+1, i.Config.OptStartSeq, "partition %d starts after the folded events", k)
	}
}

// TestRunStoppedWhileStartingIsNoFailure: a status stopped at any point of
// its start returns nil, as a stop is not a failure (a process stopped by
// a signal while it starts exits 0, and an embedding test sees no error).
func TestRunStoppedWhileStartingIsNoFailure(t *testing.T) {
	ts := pipelinetest.Start(t)
	for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		svc, err := status.New(ts.JS, status.Config{Partitions: 2, Logger: logtest.Logger()})
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Run(ctx) }()
		time.Sleep(after)
		stop()
		select {
		case err := <-done:
			require.NoError(t, err, "stopped %v after it began", after)
		case <-time.After(20 * time.Second):
			t.Fatalf("stopped %v after it began: Run did not return", after)
		}
	}
}
