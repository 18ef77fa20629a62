package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestAlerts points status's ALERT_URL at a Slack-style receiver and
// makes each alert happen once: a task that ends partial (and reaches the
// dead-letter threshold), a task whose failures trip the circuit breaker,
// and an account paused by a gateway answering 401. Each subject is
// alerted exactly once, with a {"text":...} body naming what happened.
func TestAlerts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var texts []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(raw, &body) != nil || body.Text == "" {
			http.Error(w, "want {\"text\":...}", http.StatusBadRequest)
			return
		}
		mu.Lock()
		texts = append(texts, body.Text)
		mu.Unlock()
	}))
	t.Cleanup(rcv.Close)
	locked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "token revoked", http.StatusUnauthorized)
	}))
	t.Cleanup(locked.Close)
	gw := harness.StartGateway(t, gateway.Config{PermanentPrefix: "bad-", Seed: 1})

	ts := pipelinetest.Start(t)
	cfg := harness.FastRetries()
	cfg.Status.AlertURL, cfg.Status.AlertDeadThreshold, cfg.Status.CircuitWindow = rcv.URL, 3, 10
	pipelinetest.StartPipeline(t, ts, cfg)
	// One send at a time, so the breaker sees the partial task's failures
	// spread out (3 in any 10) and trips only for the failing one; 20 a
	// second, so the failing task's 30 sends take 1.5 s and the breaker,
	// tripped after its first 10, pauses it well before they are done
	// (at 500 a second all 30 failed in 51 ms once on a loaded machine,
	// before status had folded the tenth).
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":20,"burst":1,"concurrency":1}`, gw.URL))
	ts.PutAccount(t, "locked", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":50,"concurrency":1}`, locked.URL))

	partial := contract.Task{ID: "al-partial", Channel: "webhook", Accounts: []string{"hook"}, Template: "Hi"}
	for i := range 20 {
		to := fmt.Sprintf("u-%02d", i)
		if i%4 == 0 {
			to = "bad-" + to
		}
		partial.Recipients = append(partial.Recipients, contract.Recipient{To: to})
	}
	harness.Submit(t, ts, partial)
	p := ts.WaitFinal(t, partial.ID, 30*time.Second)
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, 5, p.Failed)

	failing := contract.Task{ID: "al-breaker", Channel: "webhook", Accounts: []string{"hook"}, Template: "Hi"}
	for i := range 30 {
		failing.Recipients = append(failing.Recipients, contract.Recipient{To: fmt.Sprintf("bad-%02d", i)})
	}
	harness.Submit(t, ts, failing)
	ts.WaitProgress(t, failing.ID, 30*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused }, "paused by the breaker")

	harness.Submit(t, ts, contract.Task{ID: "al-locked", Channel: "webhook", Accounts: []string{"locked"}, Template: "Hi", Recipients: pipelinetest.Recipients("l", 5)})
	natstest.Eventually(t, 30*time.Second, func() bool { return !harness.AccountHealth(t, ts, "locked").Healthy() }, "account locked paused")

	// The quality of hook drops to YELLOW, then RED: one alert each; its
	// recovery and a repeated GREEN say nothing.
	for _, q := range []string{contract.QualityYellow, contract.QualityRed, contract.QualityGreen, contract.QualityGreen} {
		harness.PutSignals(t, ts, "hook", contract.AccountSignals{Quality: q, Event: "TEST", Source: "test"})
		time.Sleep(200 * time.Millisecond)
	}

	want := []string{
		"Broadcast: task al-partial ended partial: 15 of 20 sent, 5 failed, 0 skipped, 0 expired",
		"Broadcast: task al-partial has 3 dead letters (threshold 3)",
		"Broadcast: task al-breaker has 3 dead letters",
		"Broadcast: task al-breaker paused (circuit breaker: 100% of the last 10 attempts failed",
		"Broadcast: account locked paused: ",
		"Broadcast: account hook quality dropped to YELLOW (TEST); rate ceiling halved",
		"Broadcast: account hook quality dropped to RED (TEST); marketing sends held",
	}
	got := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), texts...) }
	if !assert.Eventually(t, func() bool { return len(got()) >= len(want) }, 20*time.Second, 20*time.Millisecond) {
		t.Fatalf("alerts arrive: got %q", got())
	}
	time.Sleep(time.Second) // anything repeated would arrive by now
	alerts := got()
	require.Len(t, alerts, len(want), "one alert per subject: %q", alerts)
	for _, w := range want {
		n := 0
		for _, a := range alerts {
			if strings.HasPrefix(a, w) {
				n++
			}
		}
		require.Equal(t, 1, n, "alert %q in %q", w, alerts)
	}
}
