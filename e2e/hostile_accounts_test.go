package e2e

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestAbsurdAccountValues writes accounts whose numbers overflowed the
// pacer (a rate of 1e19, a burst at the integer maximum; the batch worker
// crashed dispatch on them, and every replica that took the lease in turn):
// they are invalid, with an error naming the field, tasks that name them
// are rejected, and dispatch keeps sending for the other accounts.
func TestAbsurdAccountValues(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "ok", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10}`, gw.URL))
	ts.PutAccount(t, "huge-rate", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":1e19}`, gw.URL))
	ts.PutAccount(t, "huge-burst", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"burst":9223372036854775807}`, gw.URL))
	ts.PutAccount(t, "huge-batch", `{"channel":"sandbox","rate_per_sec":1e19,"max_batch":50}`)
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	for id, c := range map[string]struct{ channel, account, want string }{
		"abs-rate":  {"webhook", "huge-rate", `accounts[0]: account "huge-rate" is misconfigured: rate_per_sec: must be above 0 and at most 1e+06, got 1e+19`},
		"abs-burst": {"webhook", "huge-burst", `accounts[0]: account "huge-burst" is misconfigured: burst: must be between 1 and 1000000, got 9223372036854775807`},
		"abs-batch": {"sandbox", "huge-batch", `accounts[0]: account "huge-batch" is misconfigured: rate_per_sec: must be above 0`},
	} {
		harness.Submit(t, ts, contract.Task{ID: id, Channel: c.channel, Template: "hi", Accounts: []string{c.account}, Recipients: []contract.Recipient{{To: "a"}}})
		p := ts.WaitFinal(t, id, 15*time.Second)
		require.Equal(t, contract.StateRejected, p.State, id)
		require.Contains(t, p.Error, c.want, id)
	}

	task := contract.Task{ID: "abs-ok", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"ok"}, Recipients: pipelinetest.Recipients("u", 50)}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 30*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 50, p.Sent)
	require.Equal(t, 50, gw.Ledger().AcceptedKeys(), "only the valid account sent")
}

// TestAccountCannotReadDispatchSecrets writes WhatsApp accounts (the token
// goes out as a bearer header to the account's endpoint) that name
// dispatch's own NATS_PASSWORD, a variable nobody allowed, a variable the
// operator allowed (DISPATCH_SECRET_ENVS), and a BROADCAST_SECRET_ one, plus
// one with a plain-http endpoint on another host. Only the last two kinds
// send, with their own tokens; the endpoint never sees the NATS password,
// and each refusal names secret_env (or endpoint) and what is allowed.
func TestAccountCannotReadDispatchSecrets(t *testing.T) {
	t.Parallel()
	const natsPassword = "nats-pw-must-stay-home"
	var mu sync.Mutex
	auths := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths[r.Header.Get("Authorization")]++
		mu.Unlock()
		fmt.Fprint(w, `{"messages":[{"id":"wamid.1"}]}`)
	}))
	t.Cleanup(srv.Close)
	ts := pipelinetest.Start(t)
	account := func(name, env, endpoint string) {
		ts.PutAccount(t, name, fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":%q,"phone_number_id":"1065","rate_per_sec":50}`, endpoint, env))
	}
	account("steal", "NATS_PASSWORD", srv.URL)
	account("unlisted", "SHOP_TOKEN", srv.URL)
	account("listed", "LISTED_TOKEN", srv.URL)
	account("ok", "BROADCAST_SECRET_WA", srv.URL)
	account("plain", "BROADCAST_SECRET_WA", "http://graph.example.com")
	var logs logtest.Buffer
	cfg := harness.WithSecrets(map[string]string{"NATS_PASSWORD": natsPassword, "SHOP_TOKEN": "tok-unlisted",
		"LISTED_TOKEN": "tok-listed", "BROADCAST_SECRET_WA": "tok-ok"})
	cfg.Dispatch.SecretEnvs = []string{"LISTED_TOKEN"}
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	pipelinetest.StartPipeline(t, ts, cfg)

	task := func(id, account string) contract.Task {
		return contract.Task{ID: id, Channel: "whatsapp", Template: "hi", Accounts: []string{account},
			Recipients: []contract.Recipient{{To: "+8613800000001"}, {To: "+8613800000002"}}}
	}
	// Every service refuses the reserved name: the task is rejected.
	harness.Submit(t, ts, task("s-steal", "steal"))
	p := ts.WaitFinal(t, "s-steal", 15*time.Second)
	require.Equal(t, contract.StateRejected, p.State)
	require.Contains(t, p.Error, `accounts[0]: account "steal" is misconfigured: secret_env: NATS_PASSWORD may not be read by accounts: name a variable starting with BROADCAST_SECRET_, or one listed in dispatch's DISPATCH_SECRET_ENVS (NATS_* and other well-known variables are never allowed)`)

	// The allowed ones send with their own tokens.
	for id, acct := range map[string]string{"s-listed": "listed", "s-ok": "ok"} {
		harness.Submit(t, ts, task(id, acct))
		p := ts.WaitFinal(t, id, 30*time.Second)
		require.Equal(t, contract.StateSucceeded, p.State, id)
	}
	// Dispatch refuses the unlisted name and the plain-http endpoint: the
	// accounts never start, and say why.
	harness.Submit(t, ts, task("s-unlisted", "unlisted"))
	harness.Submit(t, ts, task("s-plain", "plain"))
	natstest.Eventually(t, 10*time.Second, func() bool {
		l := logs.String()
		return strings.Contains(l, `secret_env: SHOP_TOKEN may not be read by accounts: name a variable starting with BROADCAST_SECRET_`) &&
			strings.Contains(l, `endpoint: \"http://graph.example.com\" must use https`)
	}, "dispatch logs both refusals")
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"Bearer tok-listed": 2, "Bearer tok-ok": 2}, auths, "only the allowed accounts sent, each with its own token")
	requireNoSecret(t, "service logs", logs.String(), natsPassword)
}

// TestEndpointTokenNeverLeaks sends through webhook endpoints whose query
// string holds a token (http://127.0.0.1:PORT/send?token=SECRET), one on a
// closed port and one whose answers echo the request URL: every attempt
// fails, the recipients end in DEAD, and the token is in no event, dead
// letter, progress value or log line.
func TestEndpointTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	const token = "TOKEN-IN-QUERY-4242"
	// The echo server first: made after the closed port was freed, it
	// could be given that very port.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "cannot handle "+r.URL.String(), http.StatusBadGateway)
	}))
	t.Cleanup(echo.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "closed", fmt.Sprintf(`{"channel":"webhook","endpoint":"http://%s/send?token=%s","rate_per_sec":100}`, closed, token))
	ts.PutAccount(t, "echo", fmt.Sprintf(`{"channel":"webhook","endpoint":"%s/send?token=%s","rate_per_sec":100}`, echo.URL, token))
	var logs logtest.Buffer
	cfg := harness.FastRetries()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pipelinetest.StartPipeline(t, ts, cfg)

	for _, acct := range []string{"closed", "echo"} {
		id := "leak-" + acct
		harness.Submit(t, ts, contract.Task{ID: id, Channel: "webhook", Template: "hi", Accounts: []string{acct}, MaxAttempts: 2,
			Recipients: []contract.Recipient{{To: "a"}, {To: "b"}}})
		p := ts.WaitFinal(t, id, 30*time.Second)
		require.Equal(t, contract.StateFailed, p.State, id)
		require.Equal(t, 2, p.Failed, id)
		dead := harness.DeadLetters(t, ts, id)
		require.Len(t, dead, 2, id)
		for _, d := range dead {
			require.NotEmpty(t, d.Error)
			require.NotContains(t, d.Error, token, "dead letter")
		}
		evs := ts.Events(t, id)
		require.NotEmpty(t, evs)
		for _, e := range evs {
			require.NotContains(t, e.Error, token, "event")
		}
		t.Logf("%s: dead letter error %q", acct, dead[0].Error)
	}
	for _, stream := range []string{contract.StreamEvents, contract.StreamDead, "KV_" + contract.BucketProgress, "KV_" + contract.BucketLedger} {
		for _, m := range streamMessages(t, ts, stream) {
			requireNoSecret(t, "stream "+stream, m, token)
		}
	}
	requireNoSecret(t, "service logs", logs.String(), token)
	require.Contains(t, logs.String(), "?[redacted]", "the endpoint shows, without its query")
}

// TestDenyPrivateDestinations runs dispatch with DenyPrivate: a webhook
// account pointed at the loopback gateway is refused when dispatch connects
// (account fatal: the account pauses, nothing arrives); with AllowLoopback
// the same account sends.
func TestDenyPrivateDestinations(t *testing.T) {
	t.Parallel()
	for _, allowLoopback := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_loopback=%v", allowLoopback), func(t *testing.T) {
			t.Parallel()
			ts := pipelinetest.Start(t)
			gw := harness.StartGateway(t, harness.GatewayOK())
			// localhost: the check is on the resolved address.
			ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":100}`, strings.Replace(gw.URL, "127.0.0.1", "localhost", 1)))
			cfg := harness.FastRetries()
			cfg.Dispatch.DenyPrivate, cfg.Dispatch.AllowLoopback = true, allowLoopback
			pipelinetest.StartPipeline(t, ts, cfg)
			harness.Submit(t, ts, contract.Task{ID: "dp", Channel: "webhook", Template: "hi", Recipients: []contract.Recipient{{To: "a"}, {To: "b"}}})
			if allowLoopback {
				p := ts.WaitFinal(t, "dp", 30*time.Second)
				require.Equal(t, contract.StateSucceeded, p.State)
				require.Equal(t, 2, gw.Ledger().AcceptedKeys())
				return
			}
			var last contract.Event
			natstest.Eventually(t, 15*time.Second, func() bool {
				for _, e := range ts.Events(t, "dp") {
					if e.Code == "denied_address" {
						last = e
						return true
					}
				}
				return false
			}, "a denied_address event")
			require.Contains(t, last.Error, "is a loopback address (DISPATCH_DENY_PRIVATE)")
			require.Zero(t, gw.Ledger().Requests, "nothing reached the gateway")
		})
	}
}
