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

// TestDispatchMisconfiguredAccountMovesItsJobs: a new account dispatch
// refuses (its secret_env is neither BROADCAST_SECRET_* nor allowed) is paused with the
// reason in its health, and the jobs queued for it are sent by a healthy
// account of their channel instead of waiting unseen.
func TestDispatchMisconfiguredAccountMovesItsJobs(t *testing.T) {
	js := topologyJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accounts, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = accounts.Put(ctx, "alive", []byte(`{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":8}`))
	require.NoError(t, err)
	_, err = accounts.Put(ctx, "refused", []byte(`{"channel":"webhook","endpoint":"http://127.0.0.1:1/send","secret_env":"MY_TOKEN"}`))
	require.NoError(t, err)
	const n = 10
	for i := range n {
		job := contract.Job{ID: contract.JobID("refused", i, false), TaskID: "refused", Index: i, To: "user-" + string(rune('a'+i)),
			Body: "hi", Channel: "sandbox", Account: "refused", Priority: contract.PriorityNormal, MaxAttempts: 3}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.JobSubject("refused", contract.PriorityNormal), data)
		require.NoError(t, err)
	}

	svc, err := New(js, Config{})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() { stop(); <-done }()

	events, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(contract.EventSubject("refused", contract.EventSent)))
		return err == nil && info.State.Msgs == n
	}, 20*time.Second, 100*time.Millisecond, "every job of the refused account is sent by another")
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
