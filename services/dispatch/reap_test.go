package dispatch

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestDispatchAdoptsOrphanedQueue: jobs queued for an account that was
// deleted while no dispatch ran (seed 21322347: it was killed while moving
// them) are moved to a healthy account of their channel and sent, and the
// adopted runner is stopped once nothing is left.
func TestDispatchAdoptsOrphanedQueue(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	putAccounts(t, js, map[string]string{"alive": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":8}`})
	const n = 20
	queueJobs(t, js, "orphans", "gone", n)
	svc := runService(t, js, Config{ReapInterval: 200 * time.Millisecond})

	events, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	sentBy := map[string]int{}
	require.Eventually(t, func() bool { return sentEvents(t, js, "orphans") == n }, 20*time.Second, 100*time.Millisecond, "every orphaned job is sent")
	cons, err := events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.EventSubject("orphans", contract.EventSent)}})
	require.NoError(t, err)
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		require.NoError(t, err)
		var ev contract.Event
		require.NoError(t, json.Unmarshal(m.Data(), &ev))
		sentBy[ev.Account]++
	}
	require.Equal(t, map[string]int{"alive": n}, sentBy, "sent by the healthy account")
	require.Eventually(t, func() bool {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return svc.runners["gone"] == nil && svc.runners["alive"] != nil
	}, 10*time.Second, 100*time.Millisecond, "the adopted runner is stopped once its queue is empty")
}
