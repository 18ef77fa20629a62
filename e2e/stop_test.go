package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// waInbound is Meta's payload of users' text messages to phone number
// pnid, one {from, body} pair each.
func waInbound(pnid string, msgs ...[2]string) []byte {
	list := ""
	for i, m := range msgs {
		if i > 0 {
			list += ","
		}
		list += fmt.Sprintf(`{"from":%q,"id":"wamid.in%d","timestamp":"1764650000","type":"text","text":{"body":%q}}`, m[0], i, m[1])
	}
	return fmt.Appendf(nil, `{"object":"whatsapp_business_account","entry":[{"id":"waba","changes":[{"field":"messages","value":`+
		`{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550000000","phone_number_id":%q},`+
		`"contacts":[],"messages":[%s]}}]}]}`, pnid, list)
}

// TestStopReplyOptsOut: signed inbound WhatsApp replies " stop ", "退订"
// and "td" (the default keywords, trimmed, any case) put their senders on
// the suppression list (scope whatsapp, reason opt_out, source whatsapp,
// every category); "please stop" and the same payload with a forged
// signature (401) add nothing. A later task to the five numbers sends to
// the two that did not opt out; the others are skipped with code
// suppressed and the Graph stand-in is never called for them.
func TestStopReplyOptsOut(t *testing.T) {
	t.Parallel()
	const (
		waToken, waApp, waVerify = "wa-token", "wa-app-secret", "wa-verify-token"
		pnid                     = "106540352242923"
	)
	secrets := map[string]string{"BROADCAST_SECRET_WA": waToken, "BROADCAST_SECRET_WA_APP": waApp, "BROADCAST_SECRET_WA_VERIFY": waVerify}
	st := startFeedbackStack(t, secrets, nil)
	graph := startGraphStandIn(t, pnid, waToken)
	var mu sync.Mutex
	calls := map[string]int{}
	graph.mu.Lock()
	graph.early = func(to, _ string) { mu.Lock(); calls[to]++; mu.Unlock() }
	graph.mu.Unlock()
	st.cs.PutAccount(t, "wa", fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":%q,`+
		`"app_secret_env":"BROADCAST_SECRET_WA_APP","verify_token_env":"BROADCAST_SECRET_WA_VERIFY","rate_per_sec":500,"burst":50,"concurrency":8}`, graph.URL, pnid))
	number := func(i int) string { return fmt.Sprintf("+86138%08d", i) }

	forged := waInbound(pnid, [2]string{"8613800000004", "STOP"})
	natstest.Eventually(t, 10*time.Second, func() bool {
		code, _, err := st.post.Post(context.Background(), "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(waApp), waInbound(pnid))}, waInbound(pnid))
		return err == nil && code == http.StatusOK
	}, "feedback knows the account")
	st.postCode(t, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte("guess"), forged)}, forged, http.StatusUnauthorized)
	body := waInbound(pnid, [2]string{"8613800000001", " stop "}, [2]string{"8613800000002", "退订"},
		[2]string{"8613800000003", "td"}, [2]string{"8613800000000", "please stop"})
	st.postCode(t, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(waApp), body)}, body, http.StatusOK)

	ctx := context.Background()
	list, err := suppress.Open(ctx, st.cs.JS)
	require.NoError(t, err)
	entries := map[string]suppress.Stored{}
	require.NoError(t, list.All(ctx, func(s suppress.Stored) error { entries[s.Scope+" "+s.To] = s; return nil }))
	require.Len(t, entries, 3, "%v", entries)
	for i := 1; i <= 3; i++ {
		e, ok := entries["whatsapp "+number(i)]
		require.True(t, ok, number(i))
		require.Equal(t, [2]string{contract.ReasonOptOut, "whatsapp"}, [2]string{e.Reason, e.Source})
		require.Empty(t, e.Categories)
		require.Nil(t, e.Until)
	}

	task := contract.Task{ID: "after-stop", Channel: "whatsapp", Template: "Hi"}
	for i := range 5 {
		task.Recipients = append(task.Recipients, contract.Recipient{To: number(i)})
	}
	time.Sleep(500 * time.Millisecond) // render's and dispatch's views are watches
	harness.Submit(t, st.cs.Server, task)
	p := st.cs.WaitFinal(t, task.ID, 30*time.Second)
	codes, _ := skippedBy(st.cs.Events(t, task.ID))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("after the replies: sent %d, skipped %d (%v); Graph calls %v", p.Sent, p.Skipped, codes, calls)
	require.Equal(t, [2]int{2, 3}, [2]int{p.Sent, p.Skipped})
	require.Equal(t, map[string]string{number(1): contract.CodeSuppressed, number(2): contract.CodeSuppressed, number(3): contract.CodeSuppressed}, codes)
	require.Equal(t, map[string]int{number(0): 1, number(4): 1}, calls)
}
