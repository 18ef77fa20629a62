package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// leaseHeld reports whether account's lease is in KV broadcast_leases.
func leaseHeld(t *testing.T, js jetstream.JetStream, account string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	_, err = kv.Get(ctx, account)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

// TestIdleAccountSleeps: an account without work holds no lease once its
// first session (which creates the normal lane's consumer) has idled out;
// the consumer stays. Jobs wake it: its session takes the lease, sends
// each job once without checking for earlier sends (they are fresh to the
// consumer), and sleeps again.
func TestIdleAccountSleeps(t *testing.T) {
	old := sessionIdleClose
	sessionIdleClose = 2 * time.Second
	t.Cleanup(func() { sessionIdleClose = old })
	js := topologyJS(t)
	putAccounts(t, js, map[string]string{"sleepy": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	svc := runService(t, js, Config{})

	require.Eventually(t, func() bool { return laneExists(t, js, "sleepy", contract.PriorityNormal) }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") }, 3*sessionIdleClose+5*time.Second, 50*time.Millisecond,
		"the idle session ends and releases the lease")
	require.True(t, laneExists(t, js, "sleepy", contract.PriorityNormal), "the normal lane's consumer stays")
	svc.mu.Lock()
	r := svc.runners["sleepy"]
	svc.mu.Unlock()
	require.True(t, r.asleep())

	const n = 30
	start := time.Now()
	queueJobs(t, js, "wake", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "wake") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	woke := time.Since(start)
	require.False(t, r.asleep(), "a session runs")
	require.True(t, leaseHeld(t, js, "sleepy"))
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.Zero(t, ol.recheckThrough, "jobs queued to a consumer with state are fresh")
	t.Logf("a sleeping account sent %d jobs %s after they were queued", n, woke.Round(time.Millisecond))
	require.Less(t, woke, 3*time.Second, "the finder wakes it within a look or two")

	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") && r.asleep() }, 3*sessionIdleClose+5*time.Second, 50*time.Millisecond,
		"asleep again after the work")
	require.EqualValues(t, n, sentEvents(t, js, "wake"), "each job sent once")
}
