package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestFeedbackReceipts drives feedback's routes with stand-ins that sign
// and post like the providers, after two broadcasts (webhook channel and
// WhatsApp Cloud API) ran under nats.conf's users, feedback under its own:
// receipts shuffled, each posted twice, a failed reported before or after
// a delivered, some WhatsApp receipts posted before the send was even
// answered (ahead of their sent event), plus forged, unsigned and
// oversized posts. Progress must show exactly what the rule gives (per
// recipient the maximum of undelivered < delivered < read), one event per
// recipient and kind, the refusals counted, a bounce for an address never
// sent counted unmatched, and no permission violation in the server's log.
func TestFeedbackReceipts(t *testing.T) {
	t.Parallel()
	const (
		hookSecret, waToken, waApp, waVerify = "hook-signing-secret", "wa-token", "wa-app-secret", "wa-verify-token"
		pnid                                 = "106540352242922"
		nHook, nWA                           = 60, 40
	)
	secrets := map[string]string{"BROADCAST_SECRET_HOOK": hookSecret, "BROADCAST_SECRET_WA": waToken,
		"BROADCAST_SECRET_WA_APP": waApp, "BROADCAST_SECRET_WA_VERIFY": waVerify}
	st := startFeedbackStack(t, secrets, nil)
	hook := startHookGateway(t, hookSecret)
	graph := startGraphStandIn(t, pnid, waToken)
	st.cs.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"secret_env":"BROADCAST_SECRET_HOOK","rate_per_sec":500,"burst":50,"concurrency":8}`, hook.URL))
	st.cs.PutAccount(t, "wa", fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":%q,`+
		`"app_secret_env":"BROADCAST_SECRET_WA_APP","verify_token_env":"BROADCAST_SECRET_WA_VERIFY","rate_per_sec":500,"burst":50,"concurrency":8}`, graph.URL, pnid))
	ctx := context.Background()
	waSign := func(body []byte) map[string]string {
		return map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(waApp), body)}
	}

	// Every seventh WhatsApp recipient's delivered status is posted while
	// dispatch still waits for the send's answer.
	var mu sync.Mutex
	waPosted := map[int][]string{}
	waIndex := func(to string) int {
		var i int
		_, _ = fmt.Sscanf(to, "+86138%08d", &i)
		return i
	}
	graph.mu.Lock()
	graph.early = func(to, wamid string) {
		i := waIndex(to)
		if i%7 != 0 {
			return
		}
		body := feedbacktest.WhatsAppPayload(pnid, feedbacktest.WhatsAppStatus{ID: wamid, Status: "delivered", RecipientID: to[1:]})
		code, _, err := st.post.Post(ctx, "/webhooks/whatsapp", waSign(body), body)
		if err == nil && code == http.StatusOK {
			mu.Lock()
			waPosted[i] = append(waPosted[i], "delivered")
			mu.Unlock()
		}
	}
	graph.mu.Unlock()

	hookTask := contract.Task{ID: "fb-hook", Channel: "webhook", Template: "Hi {{.to}}", Recipients: pipelinetest.Recipients("user", nHook)}
	waTask := contract.Task{ID: "fb-wa", Channel: "whatsapp", Template: "Hi {{.to}}"}
	for i := range nWA {
		waTask.Recipients = append(waTask.Recipients, contract.Recipient{To: fmt.Sprintf("+86138%08d", i)})
	}
	harness.Submit(t, st.cs.Server, hookTask)
	harness.Submit(t, st.cs.Server, waTask)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, hookTask.ID, 60*time.Second).State)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, waTask.ID, 60*time.Second).State)
	mu.Lock()
	require.Len(t, waPosted, 6, "raced receipts posted (indexes 0, 7, ..., 35)")
	mu.Unlock()

	// The webhook gateway's receipts, by index i%6: delivered; delivered
	// and read; failed; failed and delivered; read only; none.
	type post struct {
		path    string
		headers map[string]string
		body    []byte
	}
	var posts []post
	hookPosted := map[int][]string{}
	hook.mu.Lock()
	require.Len(t, hook.keys, nHook)
	for key := range hook.keys {
		_, i, _, err := contract.ParseJobID(key)
		require.NoError(t, err)
		var sts []string
		switch i % 6 {
		case 0:
			sts = []string{"delivered"}
		case 1:
			sts = []string{"delivered", "read"}
		case 2:
			sts = []string{"failed"}
		case 3:
			sts = []string{"failed", "delivered"}
		case 4:
			sts = []string{"read"}
		}
		for _, s := range sts {
			code, reason := "", ""
			if s == "failed" {
				code, reason = "550", "mailbox unavailable"
			}
			body := feedbacktest.WebhookReceipt(key, s, code, reason, time.Now())
			posts = append(posts, post{"/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook",
				"X-Broadcast-Signature": feedbacktest.Sign([]byte(hookSecret), body)}, body})
			hookPosted[i] = append(hookPosted[i], s)
		}
	}
	hook.mu.Unlock()

	// WhatsApp's, by index i%4: delivered; read, then delivered; failed
	// 131026; sent only (a blocked user stays at sent). Five a payload.
	graph.mu.Lock()
	require.Len(t, graph.wamids, nWA)
	var statuses []feedbacktest.WhatsAppStatus
	for to, wamid := range graph.wamids {
		i := waIndex(to)
		s := feedbacktest.WhatsAppStatus{ID: wamid, RecipientID: to[1:]}
		switch i % 4 {
		case 0:
			s.Status = "delivered"
		case 1:
			r := s
			r.Status = "read"
			statuses = append(statuses, r)
			s.Status = "delivered"
		case 2:
			s.Status, s.Code, s.Title, s.Details = "failed", 131026, "Message undeliverable", "Unable to deliver message."
		case 3:
			s.Status = "sent"
		}
		statuses = append(statuses, s)
	}
	graph.mu.Unlock()
	rng := rand.New(rand.NewPCG(16, 2))
	rng.Shuffle(len(statuses), func(i, j int) { statuses[i], statuses[j] = statuses[j], statuses[i] })
	for len(statuses) > 0 {
		n := min(5, len(statuses))
		body := feedbacktest.WhatsAppPayload(pnid, statuses[:n]...)
		posts = append(posts, post{"/webhooks/whatsapp", waSign(body), body})
		for _, s := range statuses[:n] {
			if s.Status != "sent" {
				i := waIndex("+" + s.RecipientID)
				mu.Lock()
				waPosted[i] = append(waPosted[i], s.Status)
				mu.Unlock()
			}
		}
		statuses = statuses[n:]
	}

	// Everything shuffled and posted twice, as providers retry.
	posts = append(posts, posts...)
	rng.Shuffle(len(posts), func(i, j int) { posts[i], posts[j] = posts[j], posts[i] })
	var wg sync.WaitGroup
	work := make(chan post)
	for range 8 {
		wg.Go(func() {
			for p := range work {
				st.postCode(t, p.path, p.headers, p.body, http.StatusOK)
			}
		})
	}
	for _, p := range posts {
		work <- p
	}
	close(work)
	wg.Wait()

	// Forged, unsigned, unknown and oversized posts are refused: they name
	// recipients with no receipt, so any effect would show in the counts.
	var noneKey string
	hook.mu.Lock()
	for key := range hook.keys {
		if _, i, _, _ := contract.ParseJobID(key); i%6 == 5 {
			noneKey = key
		}
	}
	hook.mu.Unlock()
	forged := feedbacktest.WebhookReceipt(noneKey, "delivered", "", "", time.Now())
	st.postCode(t, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook",
		"X-Broadcast-Signature": feedbacktest.Sign([]byte("not-the-secret"), forged)}, forged, http.StatusUnauthorized)
	st.postCode(t, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook"}, forged, http.StatusUnauthorized)
	st.postCode(t, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "wa",
		"X-Broadcast-Signature": feedbacktest.Sign([]byte(hookSecret), forged)}, forged, http.StatusUnauthorized)
	huge := append(bytes.Repeat([]byte(" "), 1<<20), forged...)
	st.postCode(t, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook",
		"X-Broadcast-Signature": feedbacktest.Sign([]byte(hookSecret), huge)}, huge, http.StatusRequestEntityTooLarge)
	var blocked string
	graph.mu.Lock()
	for to, wamid := range graph.wamids {
		if i := waIndex(to); i%4 == 3 && i%7 != 0 {
			blocked = wamid
		}
	}
	graph.mu.Unlock()
	waForged := feedbacktest.WhatsAppPayload(pnid, feedbacktest.WhatsAppStatus{ID: blocked, Status: "read"})
	st.postCode(t, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte("guess"), waForged)}, waForged, http.StatusUnauthorized)
	st.postCode(t, "/webhooks/whatsapp", nil, waForged, http.StatusUnauthorized)
	waHuge := append(bytes.Repeat([]byte(" "), 1<<20), waForged...)
	st.postCode(t, "/webhooks/whatsapp", waSign(waHuge), waHuge, http.StatusRequestEntityTooLarge)
	st.postCode(t, "/webhooks/bounce", map[string]string{"Authorization": "Bearer guess"}, []byte(`{"email":"a@b.c","type":"hard"}`), http.StatusUnauthorized)
	st.postCode(t, "/webhooks/bounce", map[string]string{"Authorization": "Bearer bounce-token"}, []byte(`{"email":"nobody@example.com","type":"hard","reason":"550 5.1.1"}`), http.StatusOK)

	// Meta's handshake.
	base := "http://" + st.fb.Addr() + "/webhooks/whatsapp?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token="
	res, err := http.Get(base + url.QueryEscape(waVerify))
	require.NoError(t, err)
	challenge, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "1158201444", string(challenge))
	res, err = http.Get(base + "wrong")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	// Progress shows exactly the rule's counts.
	for _, c := range []struct {
		task   string
		posted map[int][]string
		want   [3]int
	}{
		{hookTask.ID, hookPosted, [3]int{40, 20, 10}},
		{waTask.ID, waPosted, [3]int{23, 10, 9}}, // 7 and 35 sent only, 14 failed, then delivered ahead
	} {
		mu.Lock()
		d, r, u := expectedReceipts(c.posted)
		mu.Unlock()
		require.Equal(t, c.want, [3]int{d, r, u}, "%s: what the stand-ins posted", c.task)
		p := st.cs.WaitProgress(t, c.task, 30*time.Second, func(p *contract.Progress) bool {
			return p.Delivered == d && p.Read == r && p.Undelivered == u
		}, "delivered %d read %d undelivered %d", d, r, u)
		require.Equal(t, contract.StateSucceeded, p.State, "receipts do not change the final state")
		require.LessOrEqual(t, p.Delivered+p.Undelivered, p.Sent)
	}
	// One event per recipient and kind, whatever was posted twice.
	wantEvents := func(posted map[int][]string) map[contract.EventKind]int {
		out := map[contract.EventKind]int{}
		for _, sts := range posted {
			seen := map[string]bool{}
			for _, s := range sts {
				if !seen[s] {
					seen[s] = true
					out[map[string]contract.EventKind{"delivered": contract.EventDelivered, "read": contract.EventRead, "failed": contract.EventUndelivered}[s]]++
				}
			}
		}
		return out
	}
	for task, posted := range map[string]map[int][]string{hookTask.ID: hookPosted, waTask.ID: waPosted} {
		mu.Lock()
		want := wantEvents(posted)
		mu.Unlock()
		natstest.Eventually(t, 10*time.Second, func() bool {
			got := harness.CountByKind(st.cs.Events(t, task))
			return got[contract.EventDelivered] == want[contract.EventDelivered] && got[contract.EventRead] == want[contract.EventRead] &&
				got[contract.EventUndelivered] == want[contract.EventUndelivered]
		}, "%s: receipt events %v", task, want)
		for _, ev := range harness.EventsOf(st.cs.Events(t, task), contract.EventUndelivered) {
			if task == waTask.ID {
				require.Equal(t, "131026", ev.Code)
				require.Equal(t, "Message undeliverable: Unable to deliver message.", ev.Error)
				require.True(t, strings.HasPrefix(ev.ProviderID, "wamid."), ev.ProviderID)
				require.Equal(t, "wa", ev.Account)
			} else {
				require.Equal(t, "550", ev.Code)
				require.Equal(t, "hook", ev.Account)
			}
			require.Equal(t, 1, ev.Attempt, "the sent event's attempt")
		}
	}

	// The bounce matched no send: counted unmatched after MatchWait.
	natstest.Eventually(t, 20*time.Second, func() bool { return st.fb.Stats().Unmatched == 1 }, "the bounce counted unmatched")
	m := st.samples(t)
	for _, c := range []struct {
		route, reason string
		want          float64
	}{
		{"receipts", "bad_signature", 2}, {"receipts", "unsigned", 1}, {"receipts", "too_large", 1},
		{"whatsapp", "bad_signature", 1}, {"whatsapp", "unsigned", 1}, {"whatsapp", "too_large", 1},
		{"whatsapp", "unauthorized", 1}, {"bounce", "unauthorized", 1},
	} {
		require.Equal(t, c.want, m.Sum("broadcast_feedback_refused_total", "route", c.route, "reason", c.reason), "%s %s", c.route, c.reason)
	}
	require.Equal(t, 1.0, m.Sum("broadcast_feedback_receipts_total", "source", "bounce", "result", "unmatched"))
	require.Equal(t, float64(nHook+nWA), m.Sum("broadcast_feedback_indexed_total"))

	for _, stream := range []string{contract.StreamReceipts, "KV_" + contract.BucketProviderIDs} {
		text := strings.Join(streamMessages(t, st.cs.Server, stream), "\n")
		for _, secret := range []string{hookSecret, waToken, waApp, waVerify} {
			requireNoSecret(t, stream, text, secret)
		}
	}
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}

// TestFeedbackBounces sends through an SMTP account and posts bounces the
// way an email provider's webhook does: a hard bounce makes the recipient
// undelivered, a complaint delivered (it arrived, unwanted), a soft bounce
// nothing, a hard bounce and a complaint for one address delivered (the
// rule's maximum); a bounce matches the most recent send to its address,
// whatever its case.
func TestFeedbackBounces(t *testing.T) {
	t.Parallel()
	st := startFeedbackStack(t, map[string]string{}, nil)
	srv := harness.StartSMTP(t, nil)
	st.cs.PutAccount(t, "mail", fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
		"from":"Shop <noreply@shop.example>","rate_per_sec":50,"concurrency":2}`, srv.Port()))
	harness.Submit(t, st.cs.Server, `{"id":"mail-1","channel":"smtp","template":"Hi","recipients":[
		{"to":"a@shop.example"},{"to":"b@shop.example"},{"to":"c@shop.example"},{"to":"d@shop.example"},{"to":"e@shop.example"}]}`)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "mail-1", 30*time.Second).State)
	harness.Submit(t, st.cs.Server, `{"id":"mail-2","channel":"smtp","template":"Hi again","recipients":[{"to":"a@shop.example"}]}`)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, "mail-2", 30*time.Second).State)
	natstest.Eventually(t, 10*time.Second, func() bool { return st.fb.Stats().Indexed == 6 }, "sends indexed")

	auth := map[string]string{"Authorization": "Bearer bounce-token"}
	for _, b := range []string{
		`{"email":"A@Shop.Example","type":"hard","reason":"550 5.1.1 user unknown"}`,
		`{"email":"b@shop.example","type":"complaint","reason":"abuse report"}`,
		`{"email":"c@shop.example","type":"soft","reason":"452 mailbox full"}`,
		`{"email":"d@shop.example","type":"hard"}`,
		`{"email":"d@shop.example","type":"complaint"}`,
	} {
		st.postCode(t, "/webhooks/bounce", auth, []byte(b), http.StatusOK)
	}
	st.postCode(t, "/webhooks/bounce", auth, []byte(`{"email":"x","type":"hard"}`), http.StatusBadRequest)

	p := st.cs.WaitProgress(t, "mail-2", 20*time.Second, func(p *contract.Progress) bool { return p.Undelivered == 1 }, "a's hard bounce")
	require.Equal(t, [3]int{0, 0, 1}, [3]int{p.Delivered, p.Read, p.Undelivered})
	p = st.cs.WaitProgress(t, "mail-1", 20*time.Second, func(p *contract.Progress) bool { return p.Delivered == 2 }, "b and d delivered")
	require.Equal(t, [3]int{2, 0, 0}, [3]int{p.Delivered, p.Read, p.Undelivered}, "a's bounce went to mail-2, c's soft bounce counts nothing")
	undelivered := harness.EventsOf(st.cs.Events(t, "mail-2"), contract.EventUndelivered)
	require.Len(t, undelivered, 1)
	require.Equal(t, "hard_bounce", undelivered[0].Code)
	require.Equal(t, "550 5.1.1 user unknown", undelivered[0].Error)
	require.Equal(t, "a@shop.example", undelivered[0].To)
	m := st.samples(t)
	require.Equal(t, 5.0, m.Sum("broadcast_feedback_receipts_total", "source", "bounce", "result", "stored"))
	require.Equal(t, 1.0, m.Sum("broadcast_feedback_refused_total", "route", "bounce", "reason", "bad_request"))
	natstest.Eventually(t, 10*time.Second, func() bool {
		return st.samples(t).Sum("broadcast_feedback_receipts_total", "source", "bounce", "result", "ignored") == 1
	}, "the soft bounce counted ignored")
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}
