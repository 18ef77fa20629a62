package dispatch

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestHealthWrittenWhenItChanges checks that a busy account's health is
// written again when it changes (a daily cap's use moves with every send)
// and not on every report when only updated_at would change.
func TestHealthWrittenWhenItChanges(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	putAccounts(t, js, map[string]string{
		"steady": `{"channel":"sandbox","rate_per_sec":50,"burst":5,"concurrency":4}`,
		"capped": `{"channel":"sandbox","rate_per_sec":50,"burst":5,"concurrency":4,"daily_cap":100000}`,
	})
	kv, err := js.KeyValue(t.Context(), contract.BucketHealth)
	require.NoError(t, err)
	w, err := kv.WatchAll(t.Context(), jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	var mu sync.Mutex
	puts, used := map[string]int{}, map[string]int{}
	go func() {
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			var h contract.AccountHealth
			if json.Unmarshal(e.Value(), &h) != nil {
				continue
			}
			mu.Lock()
			puts[e.Key()]++
			used[e.Key()] = h.DailyUsed
			mu.Unlock()
		}
	}()

	const interval = 100 * time.Millisecond
	runService(t, js, Config{HealthInterval: interval})
	queueJobs(t, js, "t1", "steady", 150)
	queueJobs(t, js, "t2", "capped", 150)
	// 150 jobs at 50/s: about 3 s of sending, 30 reports of each account.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return used["capped"] == 150
	}, 15*time.Second, 50*time.Millisecond, "the capped account's health shows its 150 sends")
	time.Sleep(3 * interval) // the reports after the last send
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, "steady")
	require.NoError(t, err)
	var h contract.AccountHealth
	require.NoError(t, json.Unmarshal(e.Value(), &h))

	mu.Lock()
	defer mu.Unlock()
	t.Logf("health writes over about 3 s of sending, a report every %v: steady %d, capped %d", interval, puts["steady"], puts["capped"])
	require.GreaterOrEqual(t, puts["capped"], 15, "the capped account's use changes at every report")
	require.LessOrEqual(t, puts["steady"], 5, "the steady account's health changes only at its start")
	require.Equal(t, contract.HealthHealthy, h.State)
}

// TestHealthConfirmedWhileUnchanged checks the report's rule: an unchanged
// value again after healthConfirm, a changed one at once, a forced one
// always.
func TestHealthConfirmedWhileUnchanged(t *testing.T) {
	t.Parallel()
	var n healthNote
	t0 := time.Now()
	a, b := []byte(`{"rate_per_sec":10}`), []byte(`{"rate_per_sec":5}`)
	require.True(t, n.shouldWrite(a, t0, true), "the first value")
	require.False(t, n.shouldWrite(a, t0.Add(healthConfirm-time.Second), true), "unchanged within healthConfirm")
	require.True(t, n.shouldWrite(a, t0.Add(healthConfirm), true), "unchanged, healthConfirm later")
	require.True(t, n.shouldWrite(b, t0.Add(healthConfirm+time.Second), true), "changed")
	require.True(t, n.shouldWrite(b, t0.Add(healthConfirm+2*time.Second), false), "forced")
	n.forget()
	require.True(t, n.shouldWrite(b, t0.Add(healthConfirm+3*time.Second), true), "after forget (a new session)")
}
