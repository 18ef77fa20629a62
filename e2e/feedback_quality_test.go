package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/natstest"
)

// TestFeedbackQualitySteersSending drives WhatsApp's account webhook
// (phone_number_quality_update, signed with the app secret) through
// feedback under nats.conf's users: FLAGGED makes the number RED (its
// marketing sends held, transactional ones sent at half rate), a stale
// UNFLAGGED posted late changes nothing, forged and unsigned posts are
// refused, a newer UNFLAGGED with the portfolio's limit makes it GREEN,
// releases the held sends and sets the daily cap. Undelivered receipts
// with block codes then lower the account's health score, which status
// writes to KV broadcast_scores with the exact counts.
func TestFeedbackQualitySteersSending(t *testing.T) {
	t.Parallel()
	const (
		waToken, waApp, pnid, display = "wa-token", "wa-app-secret", "106540352242922", "+1 555-078-3881"
	)
	secrets := map[string]string{"BROADCAST_SECRET_WA": waToken, "BROADCAST_SECRET_WA_APP": waApp}
	st := startFeedbackStack(t, secrets, nil)
	graph := startGraphStandIn(t, pnid, waToken)
	st.cs.PutAccount(t, "wa", fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":%q,`+
		`"display_phone_number":%q,"app_secret_env":"BROADCAST_SECRET_WA_APP","tier":"10k","rate_per_sec":60,"burst":6,"concurrency":4}`,
		graph.URL, pnid, display))
	sign := func(body []byte) map[string]string {
		return map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(waApp), body)}
	}
	signals := func() *contract.AccountSignals {
		e, err := harness.KVGet(t, st.cs.Server, contract.BucketSignals, "wa")
		if err != nil {
			return nil
		}
		s, err := contract.DecodeAccountSignals(e.Value())
		require.NoError(t, err)
		return s
	}
	sentTo := func(prefix string) int {
		graph.mu.Lock()
		defer graph.mu.Unlock()
		n := 0
		for to := range graph.wamids {
			if len(to) >= len(prefix) && to[:len(prefix)] == prefix {
				n++
			}
		}
		return n
	}
	task := func(id, prefix string, category contract.Category) contract.Task {
		tk := contract.Task{ID: id, Channel: "whatsapp", Template: "Hi", Category: category}
		for i := range 5 {
			tk.Recipients = append(tk.Recipients, contract.Recipient{To: fmt.Sprintf("%s%04d", prefix, i)})
		}
		return tk
	}
	// A first send, so dispatch runs the account and writes its health.
	harness.Submit(t, st.cs.Server, task("wa-0", "+861380000", contract.CategoryUtility))
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "wa-0", 30*time.Second).State)

	flagged := time.Now().Add(-time.Minute)
	body := feedbacktest.WhatsAppQualityPayload(feedbacktest.WhatsAppQualityUpdate{
		DisplayPhoneNumber: "15550783881", Event: "FLAGGED", CurrentLimit: "TIER_1K", At: flagged})
	st.postCode(t, "/webhooks/whatsapp", sign(body), body, http.StatusOK)
	s := signals()
	require.NotNil(t, s, "the update is stored before the post is answered")
	require.Equal(t, contract.QualityRed, s.Quality)
	require.Equal(t, 1000, s.MessagingLimit)
	require.Equal(t, "FLAGGED", s.Event)

	stale := feedbacktest.WhatsAppQualityPayload(feedbacktest.WhatsAppQualityUpdate{
		DisplayPhoneNumber: "15550783881", Event: "UNFLAGGED", At: flagged.Add(-time.Hour)})
	st.postCode(t, "/webhooks/whatsapp", sign(stale), stale, http.StatusOK)
	forged := feedbacktest.WhatsAppQualityPayload(feedbacktest.WhatsAppQualityUpdate{DisplayPhoneNumber: "15550783881", Event: "UNFLAGGED"})
	st.postCode(t, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte("guess"), forged)}, forged, http.StatusUnauthorized)
	st.postCode(t, "/webhooks/whatsapp", nil, forged, http.StatusUnauthorized)
	require.Equal(t, contract.QualityRed, signals().Quality, "neither the stale nor the forged update changed it")

	natstest.Eventually(t, 10*time.Second, func() bool {
		h := harness.AccountHealth(t, st.cs.Server, "wa")
		return h != nil && h.MarketingHeld && h.Ceiling == 30 && h.DailyCap == 1000
	}, "health: marketing held, ceiling 60 halved to 30, daily cap the reported 1000")
	harness.Submit(t, st.cs.Server, task("wa-mkt", "+861381111", ""))
	harness.Submit(t, st.cs.Server, task("wa-txn", "+861382222", contract.CategoryTransactional))
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "wa-txn", 30*time.Second).State)
	st.cs.WaitProgress(t, "wa-mkt", 20*time.Second, func(p *contract.Progress) bool { return p.Retrying == 5 }, "marketing held")
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, sentTo("+861381111"), "no marketing send while RED")
	require.Equal(t, 5, sentTo("+861382222"))

	recovered := feedbacktest.WhatsAppQualityPayload(feedbacktest.WhatsAppQualityUpdate{
		DisplayPhoneNumber: "15550783881", Event: "UNFLAGGED", CurrentLimit: "TIER_1K", MaxDailyPerBusiness: "TIER_2K"})
	st.postCode(t, "/webhooks/whatsapp", sign(recovered), recovered, http.StatusOK)
	s = signals()
	require.Equal(t, contract.QualityGreen, s.Quality)
	require.Equal(t, 2000, s.MessagingLimit, "the portfolio's limit wins over the number's current_limit")
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "wa-mkt", 30*time.Second).State, "held marketing sent once GREEN")
	require.Equal(t, 5, sentTo("+861381111"))
	natstest.Eventually(t, 10*time.Second, func() bool {
		h := harness.AccountHealth(t, st.cs.Server, "wa")
		return h != nil && !h.MarketingHeld && h.Ceiling == 60 && h.DailyCap == 2000 && h.Quality == contract.QualityGreen
	}, "health back: ceiling 60, daily cap 2000")

	// Two of the marketing recipients turn out blocked (131026, 131050).
	graph.mu.Lock()
	fail := feedbacktest.WhatsAppPayload(pnid,
		feedbacktest.WhatsAppStatus{ID: graph.wamids["+8613811110000"], Status: "failed", RecipientID: "8613811110000", Code: 131026, Title: "Message undeliverable"},
		feedbacktest.WhatsAppStatus{ID: graph.wamids["+8613811110001"], Status: "delivered", RecipientID: "8613811110001"},
		feedbacktest.WhatsAppStatus{ID: graph.wamids["+8613811110002"], Status: "failed", RecipientID: "8613811110002", Code: 131050, Title: "User stopped marketing messages"})
	graph.mu.Unlock()
	st.postCode(t, "/webhooks/whatsapp", sign(fail), fail, http.StatusOK)
	var score contract.AccountScore
	natstest.Eventually(t, 20*time.Second, func() bool {
		e, err := harness.KVGet(t, st.cs.Server, contract.BucketScores, "wa")
		if err != nil || json.Unmarshal(e.Value(), &score) != nil {
			return false
		}
		return score.Undelivered == 2 && score.Delivered == 1
	}, "status writes the account's score with the receipts")
	t.Logf("score of wa over %s: %d (sent %d, delivered %d, undelivered %d, blocked %d, rate limited %d of %d attempts, quality %s)",
		score.Window.D(), score.Score, score.Sent, score.Delivered, score.Undelivered, score.Blocked, score.RateLimited, score.Attempts, score.Quality)
	require.Equal(t, 15, score.Sent)
	require.Equal(t, 2, score.Blocked)
	require.Equal(t, contract.QualityGreen, score.Quality)
	require.Equal(t, contract.HealthScore(score), score.Score)
	require.Less(t, score.Score, 100)
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}
