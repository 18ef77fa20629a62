package shared_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// TestConsumeKeepsLongHandlersAlive: a handler that runs for 2.5 ack waits
// is not redelivered meanwhile (Consume reports progress), while quick
// messages keep flowing through the other handlers; every message is
// handled exactly once and acknowledged. The ack wait is 2 s: with 1 s, a
// quick message waiting in the client's buffer behind busy handlers (which
// no one keeps alive, and need not with real ack waits of 30 s and more)
// was once redelivered in CI's race step, under the whole suite's load.
func TestConsumeKeepsLongHandlersAlive(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ackWait = 2 * time.Second
	_, err := ts.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}})
	require.NoError(t, err)
	cons, err := ts.JS.CreateOrUpdateConsumer(ctx, "KEEP", jetstream.ConsumerConfig{
		Durable: "k", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1})
	require.NoError(t, err)

	const n = 50
	var mu sync.Mutex
	calls := map[string]int{}
	var handled atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- shared.Consume(ctx, cons, func(_ context.Context, m jetstream.Msg) error {
			mu.Lock()
			calls[m.Subject()]++
			mu.Unlock()
			if m.Subject() == "keep.slow" {
				time.Sleep(5 * ackWait / 2)
			}
			handled.Add(1)
			return nil
		}, shared.ConsumeConfig{Concurrency: 4, AckWait: ackWait})
	}()
	_, err = ts.JS.Publish(ctx, "keep.slow", nil)
	require.NoError(t, err)
	for i := range n {
		_, err = ts.JS.Publish(ctx, "keep.fast."+string(rune('a'+i%26))+string(rune('a'+i/26)), nil)
		require.NoError(t, err)
	}
	// About 5 s normally; under the race detector on a loaded CI machine a
	// pull whose answer is late is only renewed after the pull's heartbeat
	// checks, so allow a minute.
	natstest.Eventually(t, time.Minute, func() bool { return handled.Load() >= n+1 }, "every message handled")
	natstest.Eventually(t, 5*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, "every message acknowledged")
	// Past the slow handler's end plus an ack wait: nothing comes back.
	time.Sleep(ackWait + 200*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, n+1)
	for subj, c := range calls {
		require.Equal(t, 1, c, "%s handled %d times", subj, c)
	}
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.NumRedelivered)
	require.EqualValues(t, n+1, info.AckFloor.Consumer)
	cancel()
	require.NoError(t, <-done)
}

// TestConsumeSettlesLater: a handler returning Later frees its goroutine at
// once (with one handler, the next message is handled while the first
// still waits); the message is acknowledged only when its wait returns nil,
// and comes back when the wait fails.
func TestConsumeSettlesLater(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := ts.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LATER", Subjects: []string{"later.>"}})
	require.NoError(t, err)
	cons, err := ts.JS.CreateOrUpdateConsumer(ctx, "LATER", jetstream.ConsumerConfig{
		Durable: "l", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1})
	require.NoError(t, err)

	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	deliveries := map[string]int{}
	done := make(chan error, 1)
	go func() {
		done <- shared.Consume(ctx, cons, func(_ context.Context, m jetstream.Msg) error {
			subj := m.Subject()
			mu.Lock()
			order = append(order, "handled "+subj)
			deliveries[subj]++
			first := deliveries[subj] == 1
			mu.Unlock()
			return shared.Later(func(ctx context.Context) error {
				if subj == "later.a" {
					<-release
				}
				if subj == "later.b" && first {
					return shared.RetryAfter(0, errors.New("not stored"))
				}
				return nil
			})
		}, shared.ConsumeConfig{Concurrency: 1, AckWait: 5 * time.Second})
	}()
	for _, s := range []string{"later.a", "later.b"} {
		_, err = ts.JS.Publish(ctx, s, nil)
		require.NoError(t, err)
	}
	// b is handled although a's wait blocks, and nothing is acknowledged.
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return deliveries["later.b"] >= 1
	}, "second message handled while the first waits")
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 0, info.AckFloor.Consumer, "nothing acknowledged before a's wait returns")
	close(release)
	// b comes back on the loop's next pull: at once normally, but under
	// the race detector on a loaded CI machine a late pull is renewed only
	// after the pull's heartbeat checks (once over 5 s there).
	natstest.Eventually(t, time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == 2
	}, "both acknowledged once their waits succeed")
	mu.Lock()
	require.Equal(t, 1, deliveries["later.a"])
	require.Equal(t, 2, deliveries["later.b"], "b came back after its failed wait")
	mu.Unlock()
	cancel()
	require.NoError(t, <-done)
}

// TestConsumeStartsHandlersOnDemand: with room for 1,000 handlers and
// three messages, the three are handled at once by three goroutines, not
// a thousand waiting ones.
func TestConsumeStartsHandlersOnDemand(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := ts.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LAZY", Subjects: []string{"lazy.>"}})
	require.NoError(t, err)
	cons, err := ts.JS.CreateOrUpdateConsumer(ctx, "LAZY", jetstream.ConsumerConfig{
		Durable: "z", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	var started sync.WaitGroup
	started.Add(3)
	release := make(chan struct{})
	var during int
	done := make(chan error, 1)
	go func() {
		done <- shared.Consume(ctx, cons, func(_ context.Context, m jetstream.Msg) error {
			started.Done()
			<-release
			return nil
		}, shared.ConsumeConfig{Concurrency: 1000})
	}()
	for i := range 3 {
		_, err = ts.JS.Publish(ctx, fmt.Sprintf("lazy.%d", i), nil)
		require.NoError(t, err)
	}
	started.Wait() // all three at once
	during = runtime.NumGoroutine()
	close(release)
	// b comes back on the loop's next pull: at once normally, but under
	// the race detector on a loaded CI machine a late pull is renewed only
	// after the pull's heartbeat checks (once over 5 s there).
	natstest.Eventually(t, time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, "every message acknowledged")
	t.Logf("goroutines: %d before, %d with three handlers running (room for 1,000)", before, during)
	require.Less(t, during-before, 100, "handlers start on demand")
	cancel()
	require.NoError(t, <-done)
}

// TestConsumeLeaveLetsTheDeliveryInHandSettle: a message redelivered while
// its first delivery is still handled (its progress reports late: here the
// loop reports every 5 s, the server's ack wait is 300 ms) is left
// unsettled by the redelivery (Leave); the first delivery's ack, through
// Then after its Later wait, settles the message, which does not come back.
func TestConsumeLeaveLetsTheDeliveryInHandSettle(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := ts.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LEAVE", Subjects: []string{"leave.>"}})
	require.NoError(t, err)
	cons, err := ts.JS.CreateOrUpdateConsumer(ctx, "LEAVE", jetstream.ConsumerConfig{
		Durable: "l", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 300 * time.Millisecond, MaxDeliver: -1})
	require.NoError(t, err)

	var handling atomic.Bool
	var first, left atomic.Int32
	settled := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- shared.Consume(ctx, cons, func(_ context.Context, m jetstream.Msg) error {
			if !handling.CompareAndSwap(false, true) {
				left.Add(1)
				return shared.Leave(errors.New("handled by an earlier delivery"))
			}
			first.Add(1)
			time.Sleep(time.Second)
			return shared.Then(shared.Later(func(context.Context) error {
				time.Sleep(500 * time.Millisecond)
				return nil
			}), func(err error) { settled <- err })
		}, shared.ConsumeConfig{Concurrency: 4, AckWait: 10 * time.Second})
	}()
	_, err = ts.JS.Publish(ctx, "leave.a", nil)
	require.NoError(t, err)
	select {
	case err := <-settled:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first delivery was never settled")
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == 1
	}, "the message acknowledged by its first delivery")
	time.Sleep(600 * time.Millisecond) // two ack waits: nothing comes back
	require.EqualValues(t, 1, first.Load())
	require.GreaterOrEqual(t, left.Load(), int32(2), "redelivered during the first delivery's handler and wait")
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 0, info.NumAckPending)
	cancel()
	require.NoError(t, <-done)
}
