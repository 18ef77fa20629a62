package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestFeedbackReceiptOfADigest: three tasks merged into one digest message
// per recipient; the gateway reports each message delivered once, by the
// carrier's Idempotency-Key, and every task's recipient counts it: 5
// delivered in each task, not in the carrier's task alone.
func TestFeedbackReceiptOfADigest(t *testing.T) {
	t.Parallel()
	const hookSecret, n = "hook-signing-secret", 5
	st := startFeedbackStack(t, map[string]string{"BROADCAST_SECRET_HOOK": hookSecret}, nil)
	hook := startHookGateway(t, hookSecret)
	st.cs.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"secret_env":"BROADCAST_SECRET_HOOK","rate_per_sec":200,"burst":20,"concurrency":4}`, hook.URL))
	tasks := []string{"dg-a", "dg-b", "dg-c"}
	for _, id := range tasks {
		harness.Submit(t, st.cs.Server, contract.Task{ID: id, Channel: "webhook", Template: "news of " + id,
			Recipients: pipelinetest.Recipients("d", n), DigestKey: "news", DigestWindow: "2s",
			DigestTemplate: "{{.count}} updates"})
	}
	for _, id := range tasks {
		require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, id, 30*time.Second).State)
	}
	hook.mu.Lock()
	keys := make([]string, 0, len(hook.keys))
	for k := range hook.keys {
		keys = append(keys, k)
	}
	hook.mu.Unlock()
	require.Len(t, keys, n, "one message per recipient")
	for _, k := range keys {
		body := feedbacktest.WebhookReceipt(k, "delivered", "", "", time.Now())
		st.postCode(t, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook",
			"X-Broadcast-Signature": feedbacktest.Sign([]byte(hookSecret), body)}, body, http.StatusOK)
	}
	for _, id := range tasks {
		p := st.cs.WaitProgress(t, id, 20*time.Second, func(p *contract.Progress) bool { return p.Delivered == n },
			"every merged task counts its recipients delivered")
		require.Equal(t, n, p.Sent)
		require.Len(t, harness.EventsOf(st.cs.Events(t, id), contract.EventDelivered), n, "one delivered event per recipient of %s", id)
	}
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}
