package dispatch

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
)

// failPrefixHandler answers 503 to recipients starting with "fail-" and 200
// to everyone else.
func failPrefixHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			To string `json:"to"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		if strings.HasPrefix(body.To, "fail-") {
			http.Error(w, `{"error":"try later"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ok"}`))
	})
}

// longWaitRun starts a pipeline whose account (50/s, concurrency 4) sends
// 100 "fail-" recipients (503, then a 30-60 s backoff) followed by 400
// healthy ones. The failing recipients come first so that the healthy ones
// are measured while all 100 wait: a failed attempt is a real request and
// takes a token, so interleaved they would cap the healthy share at 80%.
// jobsPerMessage is render's (0: its default, job groups).
func longWaitRun(t *testing.T, cfg dispatch.Config, jobsPerMessage int) (*pipelinetest.Server, *harness.Recorder, string) {
	ts := pipelinetest.Start(t)
	rec := harness.StartRecorder(t, failPrefixHandler(), 0)
	ts.PutAccount(t, "slow", harness.WebhookAccount(rec.URL, `"rate_per_sec":50,"burst":5,"concurrency":4,"min_rate_per_sec":50`))
	// Half of the first 200 attempts fail, which would trip status's circuit
	// breaker and pause the task; this test is about slots, so it is off.
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: cfg, Status: status.Config{CircuitWindow: -1},
		Render: render.Config{JobsPerMessage: jobsPerMessage}})
	task := contract.Task{ID: "longwait", Channel: "webhook", Template: "hi {{.to}}", MaxAttempts: 5,
		Recipients: append(pipelinetest.Recipients("fail", 100), pipelinetest.Recipients("ok", 400)...)}
	harness.Submit(t, ts, task)
	return ts, rec, task.ID
}

func isHealthy(h harness.Hit) bool {
	return strings.HasPrefix(h.To, "ok-") && h.Status == http.StatusOK
}

// TestDispatchLongWaitsHoldNoSlot: 20% of recipients fail into a 60 s
// backoff; they wait as scheduled messages, so the healthy recipients still
// flow at the account's rate. The control parks the same failures with
// NakWithDelay and stalls.
func TestDispatchLongWaitsHoldNoSlot(t *testing.T) {
	const rate = 50.0
	var healthyRate, controlRate float64
	t.Run("group", func(t *testing.T) {
		t.Run("scheduled", func(t *testing.T) {
			t.Parallel()
			ts, rec, taskID := longWaitRun(t, dispatch.Config{BackoffBase: 60 * time.Second}, 0)
			harness.WaitCount(t, 30*time.Second, 400, func() int { return len(harness.FilterHits(rec.All(), isHealthy)) }, "healthy recipients accepted")
			all := rec.All()
			healthy := harness.FilterHits(all, isHealthy)
			fh := harness.MeasurePacing(healthy, 55)
			fa := harness.MeasurePacing(all, 55)
			healthyRate = fh.Rate
			fails := len(harness.FilterHits(all, func(h harness.Hit) bool { return strings.HasPrefix(h.To, "fail-") }))

			// The failed jobs wait in JOBS as scheduled messages, one each.
			var delayed int
			natstest.Eventually(t, 10*time.Second, func() bool {
				delayed = countSubjects(t, ts, contract.SubjectDelayPrefix+">")
				p := ts.Progress(t, taskID)
				return delayed == 100 && p != nil && p.Retrying == 100 && p.Sent == 400
			}, "scheduled retries and progress")
			p := ts.Progress(t, taskID)
			t.Logf("with 100 of 500 recipients in a 30-60 s backoff: healthy %s (%.0f%% of %v/s); all requests %s; fail- requests %d; scheduled messages on %s> %d; progress sent %d retrying %d failed %d",
				fh, 100*fh.Rate/rate, rate, fa, fails, contract.SubjectDelayPrefix, delayed, p.Sent, p.Retrying, p.Failed)
			require.Equal(t, 100, fails, "each failing recipient was tried once and is waiting")
			require.GreaterOrEqual(t, fh.Rate, 0.9*rate, "healthy recipients flow at the account rate")
			require.Zero(t, p.Failed)
		})
		t.Run("nak-control", func(t *testing.T) {
			t.Parallel()
			// LongWait above every backoff: all waits are NakWithDelay, for
			// jobs alone (a job of a group always comes back as a scheduled
			// copy, jobgroup.go).
			_, rec, _ := longWaitRun(t, dispatch.Config{BackoffBase: 60 * time.Second, LongWait: 10 * time.Minute}, 1)
			harness.WaitCount(t, 10*time.Second, 1, func() int { return len(rec.All()) }, "first request")
			start := rec.All()[0].At
			const window = 5 * time.Second
			time.Sleep(time.Until(start.Add(window)))
			n := len(harness.FilterHits(rec.All(), func(h harness.Hit) bool { return isHealthy(h) && h.At.Sub(start) < window }))
			controlRate = float64(n) / window.Seconds()
			t.Logf("NakWithDelay control: %d healthy recipients accepted in the first %s (%.1f/s)", n, window, controlRate)
		})
	})
	if t.Failed() {
		return
	}
	t.Logf("healthy throughput during long backoffs: scheduled %.1f/s vs NakWithDelay %.1f/s (account rate %v/s)", healthyRate, controlRate, rate)
	require.Less(t, controlRate, 0.25*rate, "the control stalls: NAKed messages hold the account's slots")
}

// countSubjects counts the messages in JOBS on subjects matching filter.
func countSubjects(t *testing.T, ts *pipelinetest.Server, filter string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := ts.JS.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	require.NoError(t, err)
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}
