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
		runStatusUntil(t, ts, status.Config{Partitions: partitions, Logger: logtest.Logger()}, until)
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

// TestFoldConsumerRemovedIsMadeAgain: a fold consumer removed while status
// runs (an operator's `nats consumer rm`, or the sweep of another
// partition count's consumers removing those of a process standing by) is
// made again at the next pull, starting after the fold consumers still on
// EVENTS, and the fold goes on: the events published after the removal
// are acknowledged.
func TestFoldConsumerRemovedIsMadeAgain(t *testing.T) {
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publish := func(from, n int) uint64 {
		var seq uint64
		for i := from; i < from+n; i++ {
			data, err := contract.EncodeEvent(&contract.Event{TaskID: "removed", JobID: fmt.Sprintf("removed.%d", i), To: "+15550000000",
				Account: "a", Kind: contract.EventSent, Index: i, Attempt: 1, At: time.Now().UTC()})
			require.NoError(t, err)
			ack, err := ts.JS.Publish(ctx, contract.EventSubject("removed", contract.EventSent), data)
			require.NoError(t, err)
			seq = ack.Sequence
		}
		return seq
	}
	svc, err := status.New(ts.JS, status.Config{Logger: logtest.Logger()})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(rctx) }()
	defer func() { stop(); require.NoError(t, <-done) }()
	stream, err := ts.JS.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	ackedTo := func(seq uint64) func() bool {
		return func() bool {
			c, err := stream.Consumer(ctx, contract.ConsumerStatus)
			return err == nil && c.CachedInfo().AckFloor.Stream >= seq
		}
	}
	natstest.Eventually(t, 20*time.Second, ackedTo(publish(0, 20)), "the first events folded")
	require.NoError(t, stream.DeleteConsumer(ctx, contract.ConsumerStatus))
	last := publish(20, 20)
	natstest.Eventually(t, 20*time.Second, ackedTo(last), "the consumer made again and the later events folded")
}

// TestOtherCountsFoldConsumersRemoved: after the partition count went
// from 4 to 1, the holder of partition 0 removes the four consumers of
// the old count, which nobody folds any more, and keeps other consumers.
func TestOtherCountsFoldConsumersRemoved(t *testing.T) {
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := ts.JS.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	leases, err := ts.JS.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	consumers := func() map[string]bool {
		out := map[string]bool{}
		names := stream.ConsumerNames(ctx)
		for n := range names.Name() {
			out[n] = true
		}
		require.NoError(t, names.Err())
		return out
	}
	run := func(partitions int, until func() bool) {
		runStatusUntil(t, ts, status.Config{Partitions: partitions, LayoutSweep: 500 * time.Millisecond, Logger: logtest.Logger()}, until)
	}
	run(4, func() bool {
		for k := range 4 {
			if _, err := leases.Get(ctx, status.FoldLeaseKey(k, 4)); err != nil {
				return false
			}
		}
		return true
	})
	// Not a fold consumer, though its name is close: it stays.
	_, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "status-audit", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	before := consumers()
	for k := range 4 {
		require.True(t, before[fmt.Sprintf("status-%d-of-4", k)])
	}

	run(1, func() bool {
		c := consumers()
		for k := range 4 {
			if c[fmt.Sprintf("status-%d-of-4", k)] {
				return false
			}
		}
		return c[contract.ConsumerStatus]
	})
	after := consumers()
	require.True(t, after["status-audit"], "not a fold consumer")
}

// runStatusUntil runs a status with cfg until until holds, then stops it
// and checks it stopped without an error.
func runStatusUntil(t *testing.T, ts *pipelinetest.Server, cfg status.Config, until func() bool) {
	t.Helper()
	stop := runStatus(t, ts, cfg)
	natstest.Eventually(t, 20*time.Second, until)
	stop()
}

// runStatus starts a status with cfg; the returned stop ends it and
// checks it stopped without an error.
func runStatus(t *testing.T, ts *pipelinetest.Server, cfg status.Config) (stop func()) {
	t.Helper()
	svc, err := status.New(ts.JS, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}
