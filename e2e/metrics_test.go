package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/metrics/metricstest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestMetricsMatchWhatWasSent runs a small broadcast through a faulty
// gateway with all four services in one registry (as `broadcast all` does),
// scrapes /metrics from the status service's HTTP server and checks every
// counter against the gateway's ledger, the final progress and the events.
func TestMetricsMatchWhatWasSent(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, gateway.Config{FailRate: 0.15, RateLimitedRate: 0.05, RetryAfter: time.Second, PermanentPrefix: "bad-", Seed: 3})
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	reg := prometheus.NewRegistry()
	cfg := harness.FastRetries()
	cfg.Ingest.Metrics, cfg.Render.Metrics, cfg.Dispatch.Metrics, cfg.Status.Metrics = reg, reg, reg, reg
	cfg.Status.DashboardAddr = "127.0.0.1:0"
	cfg.Status.PollInterval = 200 * time.Millisecond
	p := pipelinetest.StartPipeline(t, ts, cfg)

	const n, bad, noName = 80, 5, 3
	task := contract.Task{ID: "metrics", Channel: "webhook", Template: "Hi {{.name}}", MaxAttempts: 20}
	for i := range n {
		r := contract.Recipient{To: fmt.Sprintf("m-%03d", i), Vars: map[string]any{"name": "x"}}
		switch {
		case i < bad:
			r.To = fmt.Sprintf("bad-%03d", i)
		case i < bad+noName:
			r.Vars = nil
		}
		task.Recipients = append(task.Recipients, r)
	}
	harness.Submit(t, ts, task)
	harness.Submit(t, ts, task) // the same id again: ignored
	harness.Submit(t, ts, `{"id":"broken","channel":"webhook","template":"x"}`)
	final := ts.WaitFinal(t, "metrics", 60*time.Second)
	require.Equal(t, contract.StatePartial, final.State)
	require.Equal(t, n-bad-noName, final.Sent)
	require.Equal(t, bad, final.Failed)
	require.Equal(t, noName, final.Skipped)
	ts.WaitFinal(t, "broken", 10*time.Second)

	natstest.Eventually(t, 10*time.Second, func() bool { return p.Status.DashboardURL() != "" })
	url := p.Status.DashboardURL() + "metrics"
	events := ts.AllEvents(t)
	var retrying, rateLimited int
	for _, ev := range events {
		if ev.Kind == contract.EventRetrying {
			retrying++
		}
		if ev.Class == contract.ClassRateLimited {
			rateLimited++
		}
	}
	l := gw.Ledger()
	require.Positive(t, retrying, "the gateway's faults caused retries")
	var m metricstest.Samples
	natstest.Eventually(t, 10*time.Second, func() bool {
		m = metricstest.Scrape(t, url)
		return m.Sum("broadcast_events_folded_total") == float64(len(events)) &&
			m.Sum("broadcast_send_duration_seconds", "account", "hook") == float64(l.Requests) &&
			m.Sum("broadcast_tasks", "state", "partial") == 1 && m.Sum("broadcast_tasks", "state", "rejected") == 1
	}, "every event folded, every provider call timed, the task gauges polled")

	// dispatch
	require.Equal(t, float64(final.Sent), m.Sum("broadcast_sends_total", "account", "hook", "outcome", "sent", "class", "none"))
	require.Equal(t, float64(l.AcceptedKeys()), m.Sum("broadcast_sends_total", "outcome", "sent"))
	require.Equal(t, float64(bad), m.Sum("broadcast_sends_total", "outcome", "failed", "class", "permanent"))
	require.Equal(t, float64(retrying), m.Sum("broadcast_sends_total", "outcome", "retrying"))
	require.Equal(t, float64(retrying), m.Sum("broadcast_retries_total", "account", "hook"))
	require.Equal(t, float64(l.Injected["503"]), m.Sum("broadcast_retries_total", "class", "retryable"))
	require.Equal(t, float64(l.Injected["429"]), m.Sum("broadcast_retries_total", "class", "rate_limited"))
	require.Equal(t, float64(rateLimited), m.Sum("broadcast_rate_limited_total", "account", "hook"))
	require.Equal(t, float64(l.Injected["429"]), m.Sum("broadcast_rate_limited_total"))
	rate := m.Sum("broadcast_account_rate_per_sec", "account", "hook")
	require.Greater(t, rate, 0.0)
	require.LessOrEqual(t, rate, 200.0)
	// ingest
	require.Equal(t, 1.0, m.Sum("broadcast_tasks_total", "result", "accepted"))
	require.Equal(t, 1.0, m.Sum("broadcast_tasks_total", "result", "duplicate_id"))
	require.Equal(t, 1.0, m.Sum("broadcast_tasks_total", "result", "rejected"))
	// render
	require.Equal(t, float64(n-noName), m.Sum("broadcast_jobs_rendered_total"))
	require.Equal(t, float64(noName), m.Sum("broadcast_jobs_skipped_total", "reason", "template"))
	// status
	require.Equal(t, float64(final.Sent), m.Sum("broadcast_events_folded_total", "kind", "sent"))
	require.True(t, m.Has("broadcast_queue_depth", "account", "hook"), "queue depth is polled")
	require.Equal(t, 1.0, m.Sum("broadcast_tasks", "state", "partial"))
	require.Equal(t, 1.0, m.Sum("broadcast_tasks", "state", "rejected"))
	// The account's session refreshed its lease while it sent, and ends
	// idle once nothing is left: no session ended otherwise.
	require.Positive(t, m.Sum("broadcast_lease_refresh_seconds"), "lease refreshes are timed")
	natstest.Eventually(t, 30*time.Second, func() bool {
		m = metricstest.Scrape(t, url)
		return m.Sum("broadcast_account_sessions_ended_total", "cause", "idle") == 1
	}, "the account's session ends idle")
	require.Equal(t, 1.0, m.Sum("broadcast_account_sessions_ended_total"), "no session ended but the idle one")
	// No series carries a task id or a recipient.
	for name, fam := range m {
		for _, s := range fam.GetMetric() {
			for _, lp := range s.GetLabel() {
				require.NotContains(t, []string{"task_id", "to", "job_id"}, lp.GetName(), name)
				require.NotContains(t, lp.GetValue(), "m-0", "%s has a recipient label", name)
			}
		}
	}
}
