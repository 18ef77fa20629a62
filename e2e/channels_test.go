package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestWhatsAppBroadcast runs a broadcast through the WhatsApp adapter
// against a fake Graph API.
func TestWhatsAppBroadcast(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	bodies := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v21.0/1065/messages" || r.Header.Get("Authorization") != "Bearer wa-token" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"Invalid OAuth access token","type":"OAuthException","code":190}}`)
			return
		}
		var req struct {
			To   string `json:"to"`
			Text struct {
				Body string `json:"body"`
			} `json:"text"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.To == "+8613800000009" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"Message undeliverable","type":"OAuthException","code":131026}}`)
			return
		}
		mu.Lock()
		bodies[req.To] = req.Text.Body
		mu.Unlock()
		fmt.Fprintf(w, `{"messaging_product":"whatsapp","contacts":[{"input":%q,"wa_id":"x"}],"messages":[{"id":"wamid.%s"}]}`, req.To, strings.TrimPrefix(req.To, "+"))
	}))
	t.Cleanup(srv.Close)
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "wa", fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1065","rate_per_sec":50,"concurrency":4}`, srv.URL))
	pipelinetest.StartPipeline(t, ts, harness.WithSecrets(map[string]string{"BROADCAST_SECRET_WA": "wa-token"}))

	task := contract.Task{ID: "wa-1", Channel: "whatsapp", Template: "Hi {{.name}}"}
	for i := 1; i <= 9; i++ {
		task.Recipients = append(task.Recipients, contract.Recipient{To: fmt.Sprintf("+86 138 0000 000%d", i), Vars: map[string]any{"name": fmt.Sprint("N", i)}})
	}
	task.Recipients = append(task.Recipients, contract.Recipient{To: "12345", Vars: map[string]any{"name": "x"}})
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, "wa-1", 30*time.Second)
	require.Equal(t, 10, p.Total)
	require.Equal(t, 8, p.Sent)
	require.Equal(t, 1, p.Failed, "131026 is permanent")
	require.Equal(t, 1, p.Skipped, "a number not in E.164 is skipped")
	mu.Lock()
	require.Equal(t, "Hi N1", bodies["+8613800000001"], "normalised to E.164")
	mu.Unlock()
	var withID int
	for _, ev := range ts.Events(t, "wa-1") {
		if ev.Kind == contract.EventSent && strings.HasPrefix(ev.ProviderID, "wamid.") {
			withID++
		}
		if ev.Kind == contract.EventFailed {
			require.Equal(t, contract.ClassPermanent, ev.Class)
			require.Equal(t, "131026", ev.Code)
		}
	}
	require.Equal(t, 8, withID, "provider message ids are on sent events")
}

// TestWxPusherBroadcast runs a broadcast through the WxPusher adapter and
// checks the app's call rate is respected.
func TestWxPusherBroadcast(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var calls []time.Time
	uids := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			AppToken string   `json:"appToken"`
			Content  string   `json:"content"`
			UIDs     []string `json:"uids"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path != "/api/send/message" || req.AppToken != "AT_wx" {
			fmt.Fprint(w, `{"code":1001,"msg":"appToken错误","success":false}`)
			return
		}
		mu.Lock()
		calls = append(calls, time.Now())
		var data []string
		for i, u := range req.UIDs {
			uids[u]++
			code := 1000
			if u == "UID_gone" {
				code = 1001
			}
			data = append(data, fmt.Sprintf(`{"uid":%q,"code":%d,"status":"ok","messageId":7,"sendRecordId":%d}`, u, code, 100+i))
		}
		mu.Unlock()
		fmt.Fprintf(w, `{"code":1000,"msg":"处理成功","data":[%s],"success":true}`, strings.Join(data, ","))
	}))
	t.Cleanup(srv.Close)
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "wx", fmt.Sprintf(`{"channel":"wxpusher","endpoint":%q,"secret_env":"BROADCAST_SECRET_WX","rate_per_sec":2,"burst":1,"concurrency":1,"min_rate_per_sec":2}`, srv.URL))
	pipelinetest.StartPipeline(t, ts, harness.WithSecrets(map[string]string{"BROADCAST_SECRET_WX": "AT_wx"}))

	harness.Submit(t, ts, `{"id":"wx-1","channel":"wxpusher","template":"Order {{.to}} shipped","recipients":[
		{"to":"UID_a"},{"to":"UID_b"},{"to":"UID_c"},{"to":"UID_d"},{"to":"UID_gone"},{"to":"not-a-uid"}]}`)
	p := ts.WaitFinal(t, "wx-1", 30*time.Second)
	require.Equal(t, 6, p.Total)
	require.Equal(t, 4, p.Sent)
	require.Equal(t, 1, p.Failed)
	require.Equal(t, 1, p.Skipped)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 5)
	for i := 3; i < len(calls); i++ {
		// At 2 calls/s with a bucket of 1 no second holds more than
		// rate+burst = 3 calls: any four span more than a second (about
		// 1.5 s; arrival jitter under load is a few ms).
		require.Greater(t, calls[i].Sub(calls[i-3]), time.Second, "calls %d-%d", i-3, i)
	}
	require.GreaterOrEqual(t, calls[len(calls)-1].Sub(calls[0]), 1900*time.Millisecond, "5 calls at 2/s take about 2 s")
	require.Equal(t, 1, uids["UID_a"])
}

// TestSMTPBroadcast runs a broadcast through the SMTP adapter against a
// local SMTP server.
func TestSMTPBroadcast(t *testing.T) {
	t.Parallel()
	srv := harness.StartSMTP(t, map[string]string{"gone@shop.example": "550 5.1.1 mailbox unavailable"})
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "mail", fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
		"from":"Shop <noreply@shop.example>","subject":"Your order","rate_per_sec":50,"concurrency":2}`, srv.Port()))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	harness.Submit(t, ts, `{"id":"mail-1","channel":"smtp","template":"Dear {{.name}}","recipients":[
		{"to":"li@Shop.Example","vars":{"name":"Li"}},{"to":"wang@shop.example","vars":{"name":"Wang"}},
		{"to":"gone@shop.example","vars":{"name":"G"}},{"to":"not an address","vars":{"name":"X"}}]}`)
	p := ts.WaitFinal(t, "mail-1", 30*time.Second)
	require.Equal(t, 2, p.Sent)
	require.Equal(t, 1, p.Failed, "550 is permanent")
	require.Equal(t, 1, p.Skipped)
	mails := srv.Received()
	require.Len(t, mails, 2)
	var li string
	for _, m := range mails {
		if m.To[0] == "li@shop.example" {
			li = string(m.Data)
		}
	}
	require.Contains(t, li, "Dear Li")
	require.Contains(t, li, "Subject: Your order")
	require.LessOrEqual(t, srv.Connections(), 2, "connections are reused (at most the account's concurrency)")
}

// TestSMTPHTMLEscapesVariables: for an account that sends HTML
// ("html":true) render escapes the recipient's variables, so a name cannot
// inject markup; the template's own HTML stays, and a plain-text account
// gets the variable as it is.
func TestSMTPHTMLEscapesVariables(t *testing.T) {
	t.Parallel()
	srv := harness.StartSMTP(t, nil)
	ts := pipelinetest.Start(t)
	for name, html := range map[string]bool{"mail-html": true, "mail-text": false} {
		ts.PutAccount(t, name, fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
			"from":"Shop <noreply@shop.example>","html":%v,"rate_per_sec":50}`, srv.Port(), html))
	}
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())
	for id, acct := range map[string]string{"mail-h": "mail-html", "mail-t": "mail-text"} {
		harness.Submit(t, ts, fmt.Sprintf(`{"id":%q,"channel":"smtp","accounts":[%q],"template":"<p>Dear {{.name}}</p>",
			"recipients":[{"to":"%s@shop.example","vars":{"name":"<a href='x'>Li</a> & co"}}]}`, id, acct, id))
		p := ts.WaitFinal(t, id, 30*time.Second)
		require.Equal(t, 1, p.Sent, id)
	}
	byTo := map[string]string{}
	for _, m := range srv.Received() {
		byTo[m.To[0]] = string(m.Data)
	}
	require.Contains(t, byTo["mail-h@shop.example"], "<p>Dear &lt;a href=3D&#39;x&#39;&gt;Li&lt;/a&gt; &amp; co</p>", "quoted-printable HTML part")
	_, htmlPart, _ := strings.Cut(byTo["mail-h@shop.example"], "text/html")
	require.NotContains(t, htmlPart, "<a href", "no markup from the variable in the HTML part (the text part has it as text)")
	require.Contains(t, byTo["mail-t@shop.example"], "<p>Dear <a href=3D'x'>Li</a> & co</p>")
}
