package dispatch

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/status"
)

// adaptiveRun is what one run against the throttling gateway measured in
// its first adaptiveWindow of traffic.
type adaptiveRun struct {
	refused  int
	accepted int
	events   []contract.Event // sent and retrying, by time
}

// adaptiveWindow is how long each run is measured.
const adaptiveWindow = 10 * time.Second

// runAgainstThrottlingGateway sends recipients through an account of 60/s
// (burst 5, recover_after 10, plus extra account fields) to a gateway that
// refuses everything above 20/s (burst 2) with Retry-After: 1, and measures
// the first adaptiveWindow of traffic. circuitWindow configures status's
// circuit breaker (-1: off).
func runAgainstThrottlingGateway(t *testing.T, extra string, circuitWindow int) adaptiveRun {
	ts := pipelinetest.Start(t)
	gw, err := gateway.New(gateway.Config{Seed: 1, RatePerSec: 20, Burst: 2, RetryAfter: time.Second})
	require.NoError(t, err)
	rec := harness.StartRecorder(t, gw, 0)
	ts.PutAccount(t, "adapt", harness.WebhookAccount(rec.URL, `"rate_per_sec":60,"burst":5,"concurrency":8,"recover_after":10`+extra))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{
		Dispatch: dispatch.Config{BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second},
		Status:   status.Config{CircuitWindow: circuitWindow},
	})
	task := contract.Task{ID: "adaptive", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("a", 400), MaxAttempts: 100}
	harness.Submit(t, ts, task)
	harness.WaitCount(t, 10*time.Second, 1, func() int { return len(rec.All()) }, "first request")
	start := rec.All()[0].At
	time.Sleep(time.Until(start.Add(adaptiveWindow)))

	var run adaptiveRun
	for _, h := range rec.All() {
		if h.At.Sub(start) >= adaptiveWindow {
			break
		}
		switch {
		case h.Status == 429:
			run.refused++
		case h.Status/100 == 2:
			run.accepted++
		}
	}
	for _, e := range ts.Events(t, task.ID) {
		if (e.Kind == contract.EventSent || e.Kind == contract.EventRetrying) && e.At.Sub(start) < adaptiveWindow {
			run.events = append(run.events, e)
		}
	}
	sort.SliceStable(run.events, func(i, j int) bool { return run.events[i].At.Before(run.events[j].At) })
	require.Zero(t, gw.Ledger().Duplicates)
	return run
}

// TestDispatchAdaptiveRate checks that refusals slow the account before it
// sends again after its Retry-After, that the effective rate never exceeds
// the configured 60/s, and that adapting causes far fewer refusals than
// holding 60/s (min_rate_per_sec 60). recover_after is still accepted (and
// ignored). The law's own figures are in dispatch_adaptive_law_test.go.
func TestDispatchAdaptiveRate(t *testing.T) {
	const ceiling = 60.0
	var adaptive, fixed adaptiveRun
	t.Run("group", func(t *testing.T) {
		t.Run("adaptive", func(t *testing.T) {
			t.Parallel()
			adaptive = runAgainstThrottlingGateway(t, "", 0)
		})
		t.Run("fixed", func(t *testing.T) {
			t.Parallel()
			// Most of the control's attempts are refused, which would trip
			// status's circuit breaker and pause the task: turn it off, the
			// control is here to count refusals.
			fixed = runAgainstThrottlingGateway(t, `,"min_rate_per_sec":60`, -1)
		})
	})
	if t.Failed() {
		return
	}

	evs := adaptive.events
	first429 := -1
	for i, e := range evs {
		require.Positive(t, e.RatePerSec, "every sent/retrying event carries the effective rate")
		require.LessOrEqual(t, e.RatePerSec, ceiling, "the effective rate never exceeds the configured rate")
		if first429 < 0 && e.Kind == contract.EventRetrying && e.Class == contract.ClassRateLimited {
			first429 = i
		}
	}
	require.GreaterOrEqual(t, first429, 0, "the gateway rate-limited the account")
	atFirst := evs[first429].RatePerSec
	// A sent event carries the rate read when its send returned, and is
	// stamped after its ledger write, so look past the sends that were
	// already returning when the 429 came.
	var firstSentAfter float64
	for _, e := range evs[first429+1:] {
		if e.Kind == contract.EventSent && e.At.Sub(evs[first429].At) > 100*time.Millisecond {
			firstSentAfter = e.RatePerSec
			break
		}
	}
	minRate := ceiling
	for _, e := range evs[first429:] {
		minRate = min(minRate, e.RatePerSec)
	}
	var trace []string
	last := -1.0
	for _, e := range evs {
		if e.RatePerSec != last {
			trace = append(trace, fmt.Sprintf("%.4g", e.RatePerSec))
			last = e.RatePerSec
		}
	}
	t.Logf("adaptive: rate at the first 429 %.1f/s (first send after it %.1f/s), minimum %.2f/s; rate trace %v",
		atFirst, firstSentAfter, minRate, trace)
	t.Logf("first %s at the 20/s gateway: adaptive %d refused, %d accepted (%.1f/s); fixed 60/s %d refused, %d accepted (%.1f/s)",
		adaptiveWindow, adaptive.refused, adaptive.accepted, float64(adaptive.accepted)/adaptiveWindow.Seconds(),
		fixed.refused, fixed.accepted, float64(fixed.accepted)/adaptiveWindow.Seconds())

	require.Less(t, firstSentAfter, ceiling, "slowed before sending again")
	require.Less(t, minRate, ceiling/2, "well down towards the gateway's 20/s")
	// Holding 60/s the control also spends most of its time waiting out
	// Retry-After with its slots held by NAKs, so it sends far fewer
	// requests in the window: compare refusals per accepted message.
	perAdaptive := float64(adaptive.refused) / float64(adaptive.accepted)
	perFixed := float64(fixed.refused) / float64(max(fixed.accepted, 1))
	t.Logf("refused per accepted message: adaptive %.2f, fixed %.2f", perAdaptive, perFixed)
	require.Less(t, perAdaptive, perFixed/2, "adapting avoids most refusals")
	require.Greater(t, adaptive.accepted, fixed.accepted, "adapting delivers more in the same time")
	for _, e := range fixed.events {
		require.Equal(t, ceiling, e.RatePerSec, "with min_rate_per_sec = rate_per_sec the rate never changes")
	}
}
