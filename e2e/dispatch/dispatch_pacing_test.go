package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// The pacing tests are timing-sensitive, so they run serially (no
// t.Parallel): Go starts the package's parallel tests only after them.

// TestDispatchPacingOneReplica sends 1,000 recipients through one account
// (100/s, burst 5) with one dispatch replica, behind a gateway that refuses
// anything above rate+burst in any one-second window.
func TestDispatchPacingOneReplica(t *testing.T) { testPacing(t, 1) }

// TestDispatchPacingThreeReplicas is the same with three replicas: the
// account's rate holds for all of them together.
func TestDispatchPacingThreeReplicas(t *testing.T) { testPacing(t, 3) }

func testPacing(t *testing.T, replicas int) {
	const rate, burst, n = 100, 5, 1000
	e := harness.NewDispatchEnv(t, dispatch.Config{})
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, rate+burst)
	e.TS.PutAccount(t, "pace", harness.WebhookAccount(rec.URL, fmt.Sprintf(
		`"rate_per_sec":%d,"burst":%d,"concurrency":8,"min_rate_per_sec":%d`, rate, burst, rate)))
	for range replicas {
		e.StartReplica()
	}
	task := contract.Task{ID: fmt.Sprintf("pace-%d", replicas), Channel: "webhook", Template: "hi {{.to}}",
		Recipients: pipelinetest.Recipients("p", n)}
	harness.Submit(t, e.TS, task)
	p := e.TS.WaitFinal(t, task.ID, 40*time.Second)

	acc := rec.Accepted()
	f := harness.MeasurePacing(acc, rate+burst)
	issued := e.IssuePacing(rate + burst)
	p50, p99, worst := e.TransportDelays(rec)
	t.Logf("send start -> gateway handler: median %s, p99 %s, max %s", p50, p99, worst)
	t.Logf("%d replica(s): configured %d/s burst %d; achieved %.1f/s (%.1f%%); at the gateway %s; window refusals %d; senders called in dispatch: %s; sends per replica %v",
		replicas, rate, burst, f.Rate, 100*f.Rate/rate, f, rec.RefusedByWindow(), issued, e.SendsBy())

	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Len(t, acc, n, "every recipient accepted once")

	// Each sent event says when its call began: the pacing's moment, just
	// before the sender was called, and at the same pace.
	noted := map[string]time.Time{}
	for _, s := range e.SendLog() {
		noted[s.To] = s.At
	}
	for _, ev := range e.TS.Events(t, task.ID) {
		if ev.Kind == contract.EventSent {
			require.False(t, ev.CallStartedAt.After(noted[ev.To]), "%s: call began %s, sender called %s", ev.To, ev.CallStartedAt, noted[ev.To])
		}
	}
	admitted := e.CallStartPacing(rate+burst, task.ID)
	require.Equal(t, n, admitted.N, "a sent event with call_started_at for every recipient")
	t.Logf("send starts admitted (call_started_at): %s", admitted)
	require.LessOrEqual(t, admitted.MaxInSecond, rate+burst, "call_started_at in any one-second window")
	require.Zero(t, admitted.OverLimitSecs)
	if raceDetector {
		t.Log("race detector: arrival-time assertions skipped")
		return
	}
	require.Zero(t, rec.RefusedByWindow(), "the strict gateway never had to refuse")
	require.LessOrEqual(t, f.MaxInSecond, rate+burst, "requests in any one-second window")
	require.Zero(t, f.OverLimitSecs)
	require.GreaterOrEqual(t, f.Rate, 0.95*rate, "achieved rate while the account had work")
}
