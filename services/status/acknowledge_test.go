package status_test

import (
	"context"
	"fmt"
	"sync/atomic"
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

// TestFoldRewindsPastADeliveryLostOnItsWay: while status folds, another
// client pulls from its consumer and never acknowledges, so some events
// are delivered and never reach the fold (as a delivery lost in transit
// is). Status acknowledges once per flush, which acknowledges everything
// before; folding on past the gap would acknowledge the lost events
// unfolded and the task would never finish. It sees the gap in the
// delivery sequence and pulls again from its acknowledgement floor, so
// every event is counted, long before the 10 s ack wait would have
// brought the lost ones back.
func TestFoldRewindsPastADeliveryLostOnItsWay(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const task, total = "lostonitsway", 60
	publishEvent(ctx, t, ts, task, contract.Event{Kind: contract.EventAccepted, Index: -1, Total: total, State: contract.StateProcessing})

	defer runStatus(t, ts, status.Config{Logger: logtest.Logger(), FlushInterval: 50 * time.Millisecond})()
	natstest.Eventually(t, 10*time.Second, func() bool { return ts.Progress(t, task) != nil })

	cons, err := ts.JS.Consumer(ctx, contract.StreamEvents, contract.ConsumerStatus)
	require.NoError(t, err)
	require.Equal(t, jetstream.AckAllPolicy, cons.CachedInfo().Config.AckPolicy)
	var stolen atomic.Int32
	sent := 0
	send := func() {
		publishEvent(ctx, t, ts, task, contract.Event{JobID: fmt.Sprintf("%s.%d", task, sent), Kind: contract.EventSent, Index: sent, Attempt: 1})
		sent++
	}
	// A pull of one event waits behind status's own; between two of
	// status's pulls (50 ms apart while events come) it takes the next.
	for sent < total-10 {
		taken := make(chan struct{})
		go func() {
			defer close(taken)
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
			if err != nil {
				return
			}
			for range b.Messages() {
				stolen.Add(1) // never acknowledged
			}
		}()
		time.Sleep(5 * time.Millisecond)
		send()
		send()
		<-taken
	}
	require.Positive(t, stolen.Load(), "the other client took no event; the test proves nothing")
	for sent < total {
		send()
	}
	started := time.Now()
	natstest.Eventually(t, 8*time.Second, func() bool {
		p := ts.Progress(t, task)
		return p != nil && p.State == contract.StateSucceeded && p.Sent == total
	})
	t.Logf("%d of %d events taken by the other client; all folded %s after the last was published",
		stolen.Load(), total, time.Since(started).Round(time.Millisecond))
}

// TestFoldConsumerOfAnotherAckPolicyIsMadeAgain: a fold consumer left by
// a status that acknowledged each event (AckExplicit, which the server
// cannot change in place) is replaced by one acknowledging once per
// flush, starting after the old one's acknowledgement floor, and the
// events after the floor are folded onto the checkpoints.
func TestFoldConsumerOfAnotherAckPolicyIsMadeAgain(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const task = "oldconsumer"
	publishEvent(ctx, t, ts, task, contract.Event{Kind: contract.EventAccepted, Index: -1, Total: 3, State: contract.StateProcessing})
	runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, func() bool { return ts.Progress(t, task) != nil })

	// What the old status left: its consumer, acknowledged through the
	// accepted event (sequence 1).
	stream, err := ts.JS.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	require.NoError(t, stream.DeleteConsumer(ctx, contract.ConsumerStatus))
	old, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: contract.ConsumerStatus, FilterSubject: contract.SubjectEventsPrefix + ">",
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 2,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: -1, MaxAckPending: 200_000,
	})
	require.NoError(t, err)
	require.Equal(t, uint64(1), old.CachedInfo().AckFloor.Stream)
	for i := range 3 {
		publishEvent(ctx, t, ts, task, contract.Event{JobID: fmt.Sprintf("%s.%d", task, i), Kind: contract.EventSent, Index: i, Attempt: 1})
	}

	runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, func() bool {
		p := ts.Progress(t, task)
		return p != nil && p.State == contract.StateSucceeded && p.Sent == 3
	})
	c, err := stream.Consumer(ctx, contract.ConsumerStatus)
	require.NoError(t, err)
	info := c.CachedInfo()
	require.Equal(t, jetstream.AckAllPolicy, info.Config.AckPolicy)
	require.Equal(t, uint64(2), info.Config.OptStartSeq, "starts after the old consumer's acknowledgement floor")
	require.Equal(t, uint64(4), info.AckFloor.Stream, "the flush acknowledged every event")
}
