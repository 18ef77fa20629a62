package dispatch

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestDispatchMisconfiguredAccountMovesItsJobs: a new account dispatch
// refuses (its secret_env is neither BROADCAST_SECRET_* nor allowed) is paused with the
// reason in its health, and the jobs queued for it are sent by a healthy
// account of their channel instead of waiting unseen.
func TestDispatchMisconfiguredAccountMovesItsJobs(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	putAccounts(t, js, map[string]string{
		"alive":   `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":8}`,
		"refused": `{"channel":"webhook","endpoint":"http://127.0.0.1:1/send","secret_env":"MY_TOKEN"}`,
	})
	const n = 10
	queueJobs(t, js, "refused", "refused", n)
	runService(t, js, Config{})

	require.Eventually(t, func() bool { return sentEvents(t, js, "refused") == n },
		20*time.Second, 100*time.Millisecond, "every job of the refused account is sent by another")
	health, err := js.KeyValue(ctx, contract.BucketHealth)
	require.NoError(t, err)
	var h contract.AccountHealth
	require.Eventually(t, func() bool {
		e, err := health.Get(ctx, "refused")
		return err == nil && json.Unmarshal(e.Value(), &h) == nil && h.State == contract.HealthPaused
	}, 10*time.Second, 100*time.Millisecond, "the refused account's health says paused")
	require.Contains(t, h.Reason, "misconfigured")
	require.Contains(t, h.Reason, "secret_env")
	require.NotContains(t, h.Reason, "dev-", "no secret value in health")
}
