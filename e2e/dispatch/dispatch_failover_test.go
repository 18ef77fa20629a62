package dispatch

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// TestDispatchFailover runs three replicas, stops the one holding the
// account's lease while it sends, and measures how long the account's traffic
// pauses before another replica takes over. Every recipient must still be
// accepted exactly once.
func TestDispatchFailover(t *testing.T) {
	const rate, burst, n = 100, 5, 1000
	e := harness.NewDispatchEnv(t, dispatch.Config{})
	gw, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, rate+burst)
	e.TS.PutAccount(t, "pace", harness.WebhookAccount(rec.URL, `"rate_per_sec":100,"burst":5,"concurrency":8,"min_rate_per_sec":100`))
	var rs []*harness.Replica
	for range 3 {
		rs = append(rs, e.StartReplica())
	}
	task := contract.Task{ID: "failover", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("f", n)}
	harness.Submit(t, e.TS, task)

	harness.WaitCount(t, 20*time.Second, 300, func() int { return len(e.SendLog()) }, "sends before the stop")
	log := e.SendLog()
	active := log[len(log)-1].Replica
	stopAt := time.Now()
	rs[active-1].Stop()
	t.Logf("stopped replica %d after %d sends (stop took %s)", active, len(log), time.Since(stopAt).Round(time.Millisecond))

	p := e.TS.WaitFinal(t, task.ID, 40*time.Second)

	// The gap: from the stopped replica's last call to the next replica's
	// first call after it.
	log = e.SendLog()
	var lastOld, firstNew time.Time
	next := 0
	for _, s := range log {
		if s.Replica == active {
			lastOld = s.At
		}
	}
	for _, s := range log {
		if s.Replica != active && s.At.After(lastOld) {
			firstNew, next = s.At, s.Replica
			break
		}
	}
	require.False(t, firstNew.IsZero(), "another replica took over")
	gap := firstNew.Sub(lastOld)
	// The largest pause between two consecutive requests at the gateway.
	var maxPause time.Duration
	all := rec.All()
	for i := 1; i < len(all); i++ {
		maxPause = max(maxPause, all[i].At.Sub(all[i-1].At))
	}
	l := gw.Ledger()
	f := harness.MeasurePacing(rec.Accepted(), rate+burst)
	issued := e.CallStartPacing(rate+burst, task.ID)
	t.Logf("failover: replica %d -> %d, gap %s (largest pause at the gateway %s); sends per replica %v; accepted keys %d, duplicates %d; at the gateway %s; window refusals %d; send starts admitted in dispatch: %s",
		active, next, gap.Round(time.Millisecond), maxPause.Round(time.Millisecond), e.SendsBy(), l.AcceptedKeys(), l.Duplicates, f, rec.RefusedByWindow(), issued)

	require.Less(t, gap, 5*time.Second, "traffic gap while another replica takes the account over")
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys(), "every recipient accepted")
	require.Zero(t, l.Duplicates, "a graceful stop repeats nothing")
	require.LessOrEqual(t, issued.MaxInSecond, rate+burst, "pacing held across the handover")
	if !raceDetector { // see dispatch_race_test.go
		require.Zero(t, rec.RefusedByWindow(), "the strict gateway never had to refuse")
	}
}

// TestDispatchLeaseSurvivesLongRetryAfter: a Retry-After longer than the
// account lease's TTL pauses the owning replica with its slots full, so it
// sends and pulls nothing for the whole wait. It must keep the account all
// the same:
// a new owner would start with a fresh pacer at the full configured rate,
// forgetting the provider's rate limit (the reduction the 429 caused), and
// both would send at once.
func TestDispatchLeaseSurvivesLongRetryAfter(t *testing.T) {
	t.Parallel()
	const retryAfter = 12 // seconds; the lease's TTL is 5 s (shared.LeaseTTL)
	e := harness.NewDispatchEnv(t, dispatch.Config{})
	// The third request is refused, so the control law's window holds two
	// accepted answers beside the 429 and lowers the rate (a lone refusal
	// with nothing accepted around it is not evidence of a capacity, and
	// on a loaded machine the first request was often alone).
	var requests atomic.Int32
	rec := harness.StartRecorder(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 3 {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			http.Error(w, `{"error":"slow down"}`, http.StatusTooManyRequests)
			return
		}
		_, _ = w.Write([]byte(`{"id":"ok"}`))
	}), 0)
	e.TS.PutAccount(t, "held", harness.WebhookAccount(rec.URL, `"rate_per_sec":20,"burst":2,"concurrency":4`))
	for range 2 {
		e.StartReplica()
	}
	task := contract.Task{ID: "lease-wait", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("q", 30)}
	harness.Submit(t, e.TS, task)
	p := e.TS.WaitFinal(t, task.ID, 40*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)

	all := rec.All()
	owner := e.SendLog()[0].Replica
	after := map[int]int{}
	for _, s := range e.SendLog()[1:] {
		after[s.Replica]++
	}
	var resumed time.Duration // the longest pause between two requests
	var resumedAt time.Time
	for i := 1; i < len(all); i++ {
		if d := all[i].At.Sub(all[i-1].At); d > resumed {
			resumed, resumedAt = d, all[i].At
		}
	}
	maxRate := 0.0 // in the sent events of the 3 s after the wait
	for _, ev := range harness.EventsOf(e.TS.Events(t, task.ID), contract.EventSent) {
		if !ev.At.Before(resumedAt) && ev.At.Sub(resumedAt) < 3*time.Second {
			maxRate = max(maxRate, ev.RatePerSec)
		}
	}
	f := harness.MeasurePacing(rec.Accepted(), 22)
	t.Logf("Retry-After %ds: longest pause %s; owner replica %d, sends after the wait per replica %v; highest effective rate in the 3 s after the wait %.1f/s; %s",
		retryAfter, resumed.Round(time.Millisecond), owner, after, maxRate, f)
	require.GreaterOrEqual(t, resumed, (retryAfter-1)*time.Second, "Retry-After honoured")
	require.Zero(t, f.OverLimitSecs, "one sender at a time: no second above rate+burst")
	require.LessOrEqual(t, f.MaxInSecond, 22)
	require.Equal(t, map[int]int{owner: len(e.SendLog()) - 1}, after, "the owner kept the account through the wait")
	require.Less(t, maxRate, 20.0, "the reduced rate survived the wait (a new owner starts at 20/s)")
}
