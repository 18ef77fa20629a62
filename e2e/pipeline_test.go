package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestWebhookBroadcastEndToEnd sends 1,000 recipients through a gateway
// that answers 10% 503 and 5% 429, and checks every count against the
// gateway's own ledger.
func TestWebhookBroadcastEndToEnd(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	const secret = "e2e-signing-secret"
	gw := harness.StartGateway(t, gateway.Config{FailRate: 0.10, RateLimitedRate: 0.05, RetryAfter: time.Second, PermanentPrefix: "reject-", Seed: 7, Secret: secret})
	const rate, burst = 200, 10
	ts.PutAccount(t, "hook-a", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"secret_env":"BROADCAST_SECRET_E2E_HOOK","rate_per_sec":%d,"burst":%d,"concurrency":8,
		"min_rate_per_sec":100,"recover_after":5}`, gw.URL+"/send", rate, burst))
	cfg := harness.FastRetries()
	cfg.Dispatch.Getenv = func(name string) string {
		if name == "BROADCAST_SECRET_E2E_HOOK" {
			return secret
		}
		return ""
	}
	pipelinetest.StartPipeline(t, ts, cfg)

	task := contract.Task{ID: "e2e-1000", Channel: "webhook", Template: "Hi {{.name}}, code {{.code}}", Defaults: map[string]any{"code": "C-9"}, MaxAttempts: 10}
	const n = 1000
	wantFailed, wantSkipped := 0, 0
	for i := range n {
		r := contract.Recipient{To: fmt.Sprintf("user-%04d", i), Vars: map[string]any{"name": fmt.Sprintf("N%d", i)}}
		switch {
		case i%50 == 0:
			r.To = fmt.Sprintf("reject-%04d", i)
			wantFailed++
		case i == 3:
			r.Vars = nil // lacks name
			wantSkipped++
		}
		task.Recipients = append(task.Recipients, r)
	}
	task.Recipients = append(task.Recipients, task.Recipients[10], task.Recipients[11]) // listed twice
	harness.Submit(t, ts, task)

	p := ts.WaitFinal(t, task.ID, 90*time.Second)
	l := gw.Ledger()
	wantSent := n - wantFailed - wantSkipped

	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, n, p.Total)
	require.Equal(t, 2, p.Duplicates)
	require.Equal(t, wantSent, p.Sent)
	require.Equal(t, wantFailed, p.Failed)
	require.Equal(t, wantSkipped, p.Skipped)
	require.Equal(t, 0, p.Retrying)
	require.Equal(t, p.Total, p.Done())

	// The gateway's own count agrees, and no recipient was accepted twice.
	require.Equal(t, wantSent, l.AcceptedKeys(), "distinct recipients the gateway accepted")
	require.Equal(t, 0, l.Duplicates, "recipients accepted more than once")
	require.Equal(t, wantSent, l.Accepted)
	require.Zero(t, l.BadSignature, "every request carried a valid HMAC signature")
	require.Zero(t, l.BadRequest)
	require.Equal(t, wantFailed, l.Injected["400"], "each permanent reject is tried exactly once")
	require.Positive(t, l.Injected["503"], "faults were injected")
	require.Positive(t, l.Injected["429"], "rate limits were injected")
	require.Equal(t, "Hi N1, code C-9", l.Bodies["e2e-1000.1"])
	for key, body := range l.Bodies {
		require.NotContains(t, body, "<no value>", key)
	}

	// Pacing: no second carries more than rate+burst requests.
	require.LessOrEqual(t, harness.MeasurePacing(gw.All(), rate+burst).MaxInSecond, rate+burst)

	// Failed recipients are in DEAD, one each.
	dead := harness.DeadLetters(t, ts, task.ID)
	require.Len(t, dead, wantFailed)
	for _, d := range dead {
		require.True(t, strings.HasPrefix(d.Job.To, "reject-"), d.Job.To)
		require.Equal(t, contract.ClassPermanent, d.Class)
		require.Equal(t, "400", d.Code)
	}

	evs := harness.CountByKind(ts.Events(t, task.ID))
	require.Equal(t, wantSent, evs[contract.EventSent])
	require.Equal(t, wantFailed, evs[contract.EventFailed])
	require.Equal(t, wantSkipped, evs[contract.EventSkipped])
	require.Equal(t, l.Injected["503"]+l.Injected["429"], evs[contract.EventRetrying], "a retrying event per retryable answer")
}

// TestDuplicateTaskIDIgnored resubmits a finished task's id without a
// Nats-Msg-Id (so the stream's window cannot catch it) and checks nothing
// is sent again.
func TestDuplicateTaskIDIgnored(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, gateway.Config{Seed: 1})
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":500,"burst":50,"concurrency":8}`, gw.URL))
	pl := pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	task := contract.Task{ID: "dup-task", Channel: "webhook", Template: "x {{.to}}"}
	for i := range 20 {
		task.Recipients = append(task.Recipients, contract.Recipient{To: fmt.Sprintf("r%d", i)})
	}
	harness.Submit(t, ts, task)
	first := ts.WaitFinal(t, task.ID, 30*time.Second)
	require.Equal(t, contract.StateSucceeded, first.State)
	require.Equal(t, 20, gw.Ledger().Accepted)

	task.Template = "changed {{.to}}"
	harness.Submit(t, ts, task)
	natstest.Eventually(t, 10*time.Second, func() bool { return pl.Ingest.Stats.DuplicateIDs.Load() == 1 })
	time.Sleep(500 * time.Millisecond) // give a wrongly accepted copy time to send
	require.Equal(t, 20, gw.Ledger().Requests, "the duplicate sent nothing")
	again := ts.Progress(t, task.ID)
	require.Equal(t, first.Sent, again.Sent)
	require.Equal(t, first.State, again.State)
	require.Equal(t, int64(1), pl.Ingest.Stats.Accepted.Load())
}
