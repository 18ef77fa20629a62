package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// countingGateway is a webhook gateway that counts the calls per recipient.
type countingGateway struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func (g *countingGateway) count(to string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[to]
}

func (g *countingGateway) total() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.calls {
		n += c
	}
	return n
}

func startCountingGateway(t *testing.T) *countingGateway {
	g := &countingGateway{calls: map[string]int{}}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			To string `json:"to"`
		}
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &body)
		g.mu.Lock()
		g.calls[body.To]++
		g.mu.Unlock()
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(g.Close)
	return g
}

// skippedCodes maps each skipped recipient of a task to its code, and
// says whether dispatch (an account on the event) or render skipped it.
func skippedBy(evs []contract.Event) (codes map[string]string, byDispatch map[string]bool) {
	codes, byDispatch = map[string]string{}, map[string]bool{}
	for _, ev := range harness.EventsOf(evs, contract.EventSkipped) {
		codes[ev.To] = ev.Code
		byDispatch[ev.To] = ev.Account != ""
	}
	return codes, byDispatch
}

// TestSuppressRenderAndDispatch: entries on the list before a task are
// skipped by render with code suppressed (a channel entry and an "all"
// entry); entries added while the task's jobs are queued (the task paused
// after its first send, on an account paced at 2/s) are skipped by
// dispatch after resume. The gateway is called exactly once for every
// other recipient and never for a suppressed one. The entries are written
// by the operator user, as `broadcast suppress` does.
func TestSuppressRenderAndDispatch(t *testing.T) {
	t.Parallel()
	st := startFeedbackStack(t, map[string]string{}, nil)
	gw := startCountingGateway(t)
	st.cs.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":2,"burst":1,"concurrency":1`))
	ctx := context.Background()
	list, err := suppress.Open(ctx, st.cs.JS)
	require.NoError(t, err)
	_, err = list.Put(ctx, "webhook", contract.Suppression{To: "user-0001", Reason: contract.ReasonManual, Source: "test"})
	require.NoError(t, err)
	_, err = list.Put(ctx, contract.ScopeAll, contract.Suppression{To: "user-0002", Reason: contract.ReasonOptOut, Source: "test"})
	require.NoError(t, err)
	// A transactional-only entry does not stop this marketing task.
	_, err = list.Put(ctx, "webhook", contract.Suppression{To: "user-0003", Reason: contract.ReasonManual, Source: "test",
		Categories: []contract.Category{contract.CategoryTransactional}})
	require.NoError(t, err)

	const n = 20
	task := contract.Task{ID: "supp-1", Channel: "webhook", Template: "Hi {{.to}}", Recipients: pipelinetest.Recipients("user", n)}
	harness.Submit(t, st.cs.Server, task)
	harness.WaitCount(t, 20*time.Second, 1, func() int { return min(gw.total(), 1) }, "the first send")
	require.True(t, harness.Control(t, st.cs.Server, task.ID, "pause").OK)
	st.cs.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused }, "paused")
	late := []string{"user-0015", "user-0016", "user-0017", "user-0018", "user-0019"}
	for i, to := range late {
		scope := "webhook"
		if i%2 == 1 {
			scope = contract.ScopeAll
		}
		_, err := list.Put(ctx, scope, contract.Suppression{To: to, Reason: contract.ReasonManual, Source: "test"})
		require.NoError(t, err)
	}
	sentBeforeResume := gw.total()
	require.Less(t, sentBeforeResume, 12, "paced at 2/s, the late entries' recipients were still queued")
	// The view is a watch; give it the moment a watch takes.
	time.Sleep(500 * time.Millisecond)
	require.True(t, harness.Control(t, st.cs.Server, task.ID, "resume").OK)

	p := st.cs.WaitFinal(t, task.ID, 60*time.Second)
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, [3]int{n, n - 7, 7}, [3]int{p.Total, p.Sent, p.Skipped}, "total, sent, skipped")
	codes, byDispatch := skippedBy(st.cs.Events(t, task.ID))
	require.Len(t, codes, 7)
	for _, to := range append([]string{"user-0001", "user-0002"}, late...) {
		require.Equal(t, contract.CodeSuppressed, codes[to], to)
		require.Zero(t, gw.count(to), "%s never sent", to)
	}
	require.False(t, byDispatch["user-0001"], "render skips what was listed before")
	require.False(t, byDispatch["user-0002"])
	for _, to := range late {
		require.True(t, byDispatch[to], "dispatch skips %s, listed while queued", to)
	}
	for i := range n {
		to := fmt.Sprintf("user-%04d", i)
		if _, skipped := codes[to]; !skipped {
			require.Equal(t, 1, gw.count(to), "%s sent exactly once", to)
		}
	}
	require.Equal(t, n-7, gw.total(), "gateway calls")
	for _, ev := range harness.EventsOf(st.cs.Events(t, task.ID), contract.EventSkipped) {
		require.NotContains(t, ev.Error, ev.To, "the reason names scope and reason, not the recipient")
		require.Regexp(t, `^on the suppression list \(scope (webhook|all), reason (manual|opt_out)\)$`, ev.Error)
	}
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}

// TestSuppressFromFeedback: a WhatsApp 131050 receipt (marketing opt-out)
// and a 131049 (per-user marketing limit: a 24 h hold) make a later
// marketing task skip those recipients with code suppressed while a
// transactional task still sends to them; 131026 suppresses nothing. An
// email hard bounce and a complaint suppress those addresses for later
// tasks of any category. Counts are checked against the stand-ins' calls.
func TestSuppressFromFeedback(t *testing.T) {
	t.Parallel()
	const (
		waToken, waApp, waVerify = "wa-token", "wa-app-secret", "wa-verify-token"
		pnid                     = "106540352242922"
	)
	secrets := map[string]string{"BROADCAST_SECRET_WA": waToken, "BROADCAST_SECRET_WA_APP": waApp, "BROADCAST_SECRET_WA_VERIFY": waVerify}
	st := startFeedbackStack(t, secrets, nil)
	graph := startGraphStandIn(t, pnid, waToken)
	var mu sync.Mutex
	waCalls := map[string]int{}
	graph.mu.Lock()
	graph.early = func(to, _ string) { mu.Lock(); waCalls[to]++; mu.Unlock() }
	graph.mu.Unlock()
	st.cs.PutAccount(t, "wa", fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":%q,`+
		`"app_secret_env":"BROADCAST_SECRET_WA_APP","verify_token_env":"BROADCAST_SECRET_WA_VERIFY","rate_per_sec":500,"burst":50,"concurrency":8}`, graph.URL, pnid))
	srv := harness.StartSMTP(t, nil)
	st.cs.PutAccount(t, "mail", fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
		"from":"Shop <noreply@shop.example>","rate_per_sec":50,"concurrency":2}`, srv.Port()))
	ctx := context.Background()

	wa := func(id string, category contract.Category) contract.Task {
		t := contract.Task{ID: id, Channel: "whatsapp", Template: "Hi", Category: category}
		for i := range 5 {
			t.Recipients = append(t.Recipients, contract.Recipient{To: fmt.Sprintf("+86138%08d", i)})
		}
		return t
	}
	harness.Submit(t, st.cs.Server, wa("wa-1", ""))
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "wa-1", 30*time.Second).State)
	harness.Submit(t, st.cs.Server, `{"id":"mail-1","channel":"smtp","template":"Hi","recipients":[{"to":"a@shop.example"},{"to":"b@shop.example"},{"to":"c@shop.example"}]}`)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "mail-1", 30*time.Second).State)
	natstest.Eventually(t, 10*time.Second, func() bool { return st.fb.Stats().Indexed == 8 }, "sends indexed")

	graph.mu.Lock()
	wamid := func(i int) string { return graph.wamids[fmt.Sprintf("+86138%08d", i)] }
	body := feedbacktest.WhatsAppPayload(pnid,
		feedbacktest.WhatsAppStatus{ID: wamid(1), Status: "failed", RecipientID: "8613800000001", Code: 131050, Title: "User's marketing opt-out"},
		feedbacktest.WhatsAppStatus{ID: wamid(2), Status: "failed", RecipientID: "8613800000002", Code: 131049, Title: "Per-user marketing limit"},
		feedbacktest.WhatsAppStatus{ID: wamid(3), Status: "failed", RecipientID: "8613800000003", Code: 131026, Title: "Undeliverable"})
	graph.mu.Unlock()
	st.postCode(t, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(waApp), body)}, body, http.StatusOK)
	auth := map[string]string{"Authorization": "Bearer bounce-token"}
	st.postCode(t, "/webhooks/bounce", auth, []byte(`{"email":"b@shop.example","type":"hard","reason":"550 5.1.1 user unknown"}`), http.StatusOK)
	st.postCode(t, "/webhooks/bounce", auth, []byte(`{"email":"c@shop.example","type":"complaint"}`), http.StatusOK)
	st.cs.WaitProgress(t, "wa-1", 20*time.Second, func(p *contract.Progress) bool { return p.Undelivered == 3 }, "three undelivered")
	st.cs.WaitProgress(t, "mail-1", 20*time.Second, func(p *contract.Progress) bool { return p.Undelivered+p.Delivered == 2 }, "bounce and complaint")

	list, err := suppress.Open(ctx, st.cs.JS)
	require.NoError(t, err)
	entries := map[string]suppress.Stored{}
	natstest.Eventually(t, 10*time.Second, func() bool {
		clear(entries)
		_ = list.All(ctx, func(s suppress.Stored) error { entries[s.Scope+" "+s.To] = s; return nil })
		return len(entries) == 4
	}, "four entries from feedback")
	optOut, hold := entries["whatsapp +8613800000001"], entries["whatsapp +8613800000002"]
	require.Equal(t, contract.ReasonOptOut, optOut.Reason)
	require.Equal(t, []contract.Category{contract.CategoryMarketing}, optOut.Categories)
	require.Nil(t, optOut.Until)
	require.Equal(t, contract.ReasonFrequencyCap, hold.Reason)
	require.NotNil(t, hold.Until)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), *hold.Until, time.Minute)
	require.Equal(t, contract.ReasonBounce, entries["smtp b@shop.example"].Reason)
	require.Equal(t, contract.ReasonComplaint, entries["smtp c@shop.example"].Reason)
	require.Equal(t, "feedback", entries["smtp b@shop.example"].Source)
	time.Sleep(500 * time.Millisecond) // the services' views are watches

	harness.Submit(t, st.cs.Server, wa("wa-2", contract.CategoryMarketing))
	p := st.cs.WaitFinal(t, "wa-2", 30*time.Second)
	require.Equal(t, [3]int{5, 3, 2}, [3]int{p.Total, p.Sent, p.Skipped}, "marketing: the opt-out and the hold are skipped")
	codes, _ := skippedBy(st.cs.Events(t, "wa-2"))
	require.Equal(t, map[string]string{"+8613800000001": contract.CodeSuppressed, "+8613800000002": contract.CodeSuppressed}, codes)
	harness.Submit(t, st.cs.Server, wa("wa-3", contract.CategoryTransactional))
	p = st.cs.WaitFinal(t, "wa-3", 30*time.Second)
	require.Equal(t, [3]int{5, 5, 0}, [3]int{p.Total, p.Sent, p.Skipped}, "transactional: all sent")
	mu.Lock()
	require.Equal(t, map[string]int{"+8613800000000": 3, "+8613800000001": 2, "+8613800000002": 2, "+8613800000003": 3, "+8613800000004": 3}, waCalls,
		"calls per recipient; 131026's recipient is not suppressed")
	mu.Unlock()

	harness.Submit(t, st.cs.Server, `{"id":"mail-2","channel":"smtp","template":"Your receipt","category":"transactional","recipients":[{"to":"a@shop.example"},{"to":"B@Shop.Example"},{"to":"c@shop.example"}]}`)
	p = st.cs.WaitFinal(t, "mail-2", 30*time.Second)
	require.Equal(t, [3]int{3, 1, 2}, [3]int{p.Total, p.Sent, p.Skipped}, "a bounce and a complaint suppress every category, whatever the address's case")
	mails := map[string]int{}
	for _, m := range srv.Received() {
		for _, to := range m.To {
			mails[to]++
		}
	}
	require.Equal(t, map[string]int{"a@shop.example": 2, "b@shop.example": 1, "c@shop.example": 1}, mails)
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}
