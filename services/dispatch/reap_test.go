package dispatch

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestDispatchAdoptsOrphanedQueue: jobs queued for an account that was
// deleted while no dispatch ran (seed 21322347: it was killed while moving
// them) are moved to a healthy account of their channel and sent, and the
// adopted runner is stopped once nothing is left.
func TestDispatchAdoptsOrphanedQueue(t *testing.T) {
	js := topologyJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accounts, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = accounts.Put(ctx, "alive", []byte(`{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":8}`))
	require.NoError(t, err)
	const n = 20
	for i := range n {
		job := contract.Job{ID: contract.JobID("orphans", i, false), TaskID: "orphans", Index: i, To: "user-" + string(rune('a'+i)),
			Body: "hi", Channel: "sandbox", Account: "gone", Priority: contract.PriorityNormal, MaxAttempts: 3}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.JobSubject("gone", contract.PriorityNormal), data)
		require.NoError(t, err)
	}

	svc, err := New(js, Config{ReapInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() { stop(); <-done }()

	events, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	sentBy := map[string]int{}
	require.Eventually(t, func() bool {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(contract.EventSubject("orphans", contract.EventSent)))
		return err == nil && info.State.Msgs == n
	}, 20*time.Second, 100*time.Millisecond, "every orphaned job is sent")
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
