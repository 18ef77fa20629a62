package shared_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// TestStopHandsMessagesBackOnce: a stopping loop whose handler hands its
// message back at once (a retry without delay, as dispatch does for jobs
// its stop left unbegun) and whose other message arrives while the one
// handler is busy gets neither back: each was delivered to it exactly
// once, so the next consumer sees delivery 2 of both. LeftAtStop is told
// of the message no handler saw, and of that one only. Without the hold
// a retry NAKed while the subscription still stood came straight back to
// the stopping loop, over and over, unseen by any handler.
func TestStopHandsMessagesBackOnce(t *testing.T) {
	ts := natstest.Start(t)
	ctx := t.Context()
	_, err := ts.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "STOP", Subjects: []string{"stop.>"}})
	require.NoError(t, err)
	cons, err := ts.JS.CreateOrUpdateConsumer(ctx, "STOP", jetstream.ConsumerConfig{
		Durable: "s", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1})
	require.NoError(t, err)
	for round := range 10 {
		for _, s := range []string{"stop.a", "stop.b"} {
			_, err = ts.JS.Publish(ctx, s, nil)
			require.NoError(t, err)
		}
		cctx, stop := context.WithCancel(ctx)
		started := make(chan struct{}, 1)
		var mu sync.Mutex
		var handled, left []string
		done := make(chan error, 1)
		go func() {
			done <- shared.Consume(cctx, cons, func(_ context.Context, m jetstream.Msg) error {
				mu.Lock()
				handled = append(handled, m.Subject())
				mu.Unlock()
				started <- struct{}{}
				<-cctx.Done() // the stop: hand it back at once
				return shared.RetryAfter(0, errors.New("left unbegun at a stop"))
			}, shared.ConsumeConfig{Concurrency: 1, AckWait: 30 * time.Second,
				LeftAtStop: func(_ context.Context, m jetstream.Msg) {
					mu.Lock()
					left = append(left, m.Subject())
					mu.Unlock()
				}})
		}()
		<-started
		// The other message reaches the loop (its pull asks for one more
		// than the busy handler) and waits for the handler.
		natstest.Eventually(t, 10*time.Second, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumAckPending == 2
		}, "both delivered")
		stop()
		require.NoError(t, <-done)

		delivered := map[string]uint64{}
		batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			require.NoError(t, err)
			delivered[m.Subject()] = meta.NumDelivered
			require.NoError(t, m.Ack())
		}
		require.Equal(t, map[string]uint64{"stop.a": 2, "stop.b": 2}, delivered, "round %d: each delivered once to the stopping loop", round)
		mu.Lock()
		require.Equal(t, []string{"stop.a"}, handled, "round %d", round)
		require.Equal(t, []string{"stop.b"}, left, "round %d: told of the delivery no handler saw", round)
		mu.Unlock()
	}
}
