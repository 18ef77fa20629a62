package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// TestPauseResumeCancel pauses a running broadcast, measures how soon sends
// stop, resumes it, then cancels it and checks the counts are exact.
func TestPauseResumeCancel(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":50,"burst":5,"concurrency":4}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	const n = 600
	harness.Submit(t, ts, contract.Task{ID: "prc", Channel: "webhook", Template: "m {{.to}}", Recipients: pipelinetest.Recipients("u", n)})
	natstest.Eventually(t, 30*time.Second, func() bool { return gw.Ledger().Accepted >= 100 })

	harness.Control(t, ts, "prc", contract.ActionPause)
	pausedAt := time.Now()
	p := ts.WaitProgress(t, "prc", 3*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused })
	time.Sleep(2 * time.Second)
	last := gw.LastArrival()
	atPause := gw.Ledger().Accepted
	t.Logf("pause: last send started %s after the pause reply; %d sent at pause", last.Sub(pausedAt).Round(time.Millisecond), atPause)
	require.Less(t, last.Sub(pausedAt), time.Second, "no new send starts more than 1 s after pause")
	time.Sleep(time.Second)
	require.Equal(t, atPause, gw.Ledger().Accepted, "nothing is sent while paused")
	require.Equal(t, contract.StatePaused, ts.Progress(t, "prc").State)
	require.Less(t, p.Sent, n)

	harness.Control(t, ts, "prc", contract.ActionResume)
	ts.WaitProgress(t, "prc", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateProcessing })
	natstest.Eventually(t, 30*time.Second, func() bool { return gw.Ledger().Accepted >= atPause+100 })

	harness.Control(t, ts, "prc", contract.ActionCancel)
	final := ts.WaitFinal(t, "prc", 30*time.Second)
	l := gw.Ledger()
	t.Logf("cancel: sent %d, cancelled %d", final.Sent, final.Cancelled)
	require.Equal(t, contract.StateCancelled, final.State)
	require.Equal(t, n, final.Sent+final.Cancelled)
	require.Positive(t, final.Cancelled)
	require.Equal(t, l.AcceptedKeys(), final.Sent, "progress equals what the gateway accepted")
	require.Zero(t, l.Duplicates)

	// A finished task refuses further control.
	_, err := client.Control(context.Background(), ts.NC, "prc", contract.ActionResume)
	require.ErrorContains(t, err, "already cancelled")
}

// TestTestRecipientsAwaitApproval sends the test recipients first, waits
// for a resume, then sends the rest.
func TestTestRecipientsAwaitApproval(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	task := contract.Task{ID: "approve", Channel: "webhook", Template: "hello {{.to}}", Recipients: pipelinetest.Recipients("c", 50),
		TestRecipients: []contract.Recipient{{To: "qa-1"}, {To: "qa-2"}}}
	harness.Submit(t, ts, task)
	natstest.Eventually(t, 10*time.Second, func() bool { return gw.Ledger().Accepted == 2 })
	p := ts.WaitProgress(t, "approve", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateAwaitingApproval })
	require.Equal(t, 50, p.Total)
	require.Zero(t, p.Sent)
	time.Sleep(time.Second)
	l := gw.Ledger()
	require.Equal(t, 2, l.Accepted, "only the test recipients before approval")
	require.Equal(t, "hello qa-1", l.Bodies["approve.t0"])

	harness.Control(t, ts, "approve", contract.ActionResume)
	final := ts.WaitFinal(t, "approve", 20*time.Second)
	require.Equal(t, contract.StateSucceeded, final.State)
	require.Equal(t, 50, final.Sent)
	require.Equal(t, 52, gw.Ledger().AcceptedKeys())

	// Cancelling instead of approving cancels every recipient.
	task.ID = "reject-approval"
	harness.Submit(t, ts, task)
	ts.WaitProgress(t, task.ID, 10*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateAwaitingApproval })
	harness.Control(t, ts, task.ID, contract.ActionCancel)
	final = ts.WaitFinal(t, task.ID, 10*time.Second)
	require.Equal(t, contract.StateCancelled, final.State)
	require.Equal(t, 50, final.Cancelled)
	require.Zero(t, final.Sent)
}

// TestExpiresAtTurnsTheRestExpired runs a task slower than its expiry.
func TestExpiresAtTurnsTheRestExpired(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":20,"burst":1,"concurrency":2}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	expires := time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	harness.Submit(t, ts, contract.Task{ID: "exp", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("e", 200), ExpiresAt: expires})
	final := ts.WaitFinal(t, "exp", 30*time.Second)
	t.Logf("expiry: sent %d, expired %d", final.Sent, final.Expired)
	require.Equal(t, contract.StatePartial, final.State)
	require.Equal(t, 200, final.Sent+final.Expired)
	require.Positive(t, final.Expired)
	require.Positive(t, final.Sent)
	require.Equal(t, final.Sent, gw.Ledger().AcceptedKeys())
}

// refusingGateway runs the pipeline on ts with one webhook account whose
// gateway answers 400 to the idempotency keys refuse picks until fixed is
// set, and accepts everything else.
func refusingGateway(t *testing.T, ts *pipelinetest.Server, refuse func(key string) bool) (*gateway.Gateway, *atomic.Bool) {
	t.Helper()
	g, err := gateway.New(harness.GatewayOK())
	require.NoError(t, err)
	fixed := new(atomic.Bool)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fixed.Load() && refuse(r.Header.Get("Idempotency-Key")) {
			http.Error(w, "not yet", http.StatusBadRequest)
			return
		}
		g.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, srv.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())
	return g, fixed
}

// TestRetryDeadRequeuesThroughPacing fails some recipients permanently,
// fixes the gateway, and re-queues the dead letters.
func TestRetryDeadRequeuesThroughPacing(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	g, fixed := refusingGateway(t, ts, func(key string) bool { return strings.Contains(key, ".1") })

	harness.Submit(t, ts, contract.Task{ID: "rd", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("d", 30)})
	first := ts.WaitFinal(t, "rd", 20*time.Second)
	// Keys rd.1 and rd.10..rd.19 were refused: 11 recipients.
	require.Equal(t, 11, first.Failed)
	require.Equal(t, contract.StatePartial, first.State)
	require.Len(t, harness.DeadLetters(t, ts, "rd"), 11)

	fixed.Store(true)
	reply := harness.Control(t, ts, "rd", contract.ActionRetryDead)
	require.Equal(t, 11, reply.Requeued)
	final := ts.WaitProgress(t, "rd", 20*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateSucceeded })
	require.Equal(t, 30, final.Sent)
	require.Zero(t, final.Failed)
	require.Empty(t, harness.DeadLetters(t, ts, "rd"), "re-queued dead letters are purged")
	require.Equal(t, 30, g.Ledger().AcceptedKeys())
	require.Zero(t, g.Ledger().Duplicates)
}

// TestRetryDeadLiftsAPauseTheTaskOutran: a pause that came just before a
// task's last outcomes leaves the finished task's run state paused, and a
// resume is refused for a final task. A retry-dead then re-queues its dead
// letters for a new run that the old pause must not hold: they are sent
// and the task finishes (multi-process scenario seed 959139463 left them
// parked and the task paused for good).
func TestRetryDeadLiftsAPauseTheTaskOutran(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	g, fixed := refusingGateway(t, ts, func(key string) bool { return strings.HasSuffix(key, ".1") })

	harness.Submit(t, ts, contract.Task{ID: "rdp", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("d", 5)})
	first := ts.WaitFinal(t, "rdp", 20*time.Second)
	require.Equal(t, contract.StatePartial, first.State)
	require.Equal(t, 1, first.Failed)
	// The pause the task outran.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	control, err := ts.JS.KeyValue(ctx, contract.BucketControl)
	require.NoError(t, err)
	require.NoError(t, shared.PutControl(ctx, control, "rdp", contract.Control{State: contract.StatePaused}))
	_, err = client.Control(ctx, ts.NC, "rdp", contract.ActionResume)
	require.ErrorContains(t, err, "already partial")

	fixed.Store(true)
	reply := harness.Control(t, ts, "rdp", contract.ActionRetryDead)
	require.Equal(t, 1, reply.Requeued)
	final := ts.WaitProgress(t, "rdp", 20*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateSucceeded })
	require.Equal(t, 5, final.Sent)
	require.Equal(t, 5, g.Ledger().AcceptedKeys())
	require.Zero(t, g.Ledger().Duplicates)
}

// TestCircuitBreakerPausesAFailingTask sends into a gateway that fails
// everything; the task pauses itself with the reason.
func TestCircuitBreakerPausesAFailingTask(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, gateway.Config{FailRate: 1, Seed: 1})
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	cfg := harness.FastRetries()
	cfg.Status = status.Config{CircuitWindow: 40, CircuitThreshold: 0.5}
	pipelinetest.StartPipeline(t, ts, cfg)

	harness.Submit(t, ts, contract.Task{ID: "cb", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("f", 500), MaxAttempts: 50})
	p := ts.WaitProgress(t, "cb", 20*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused })
	require.Contains(t, p.Error, "circuit breaker: 100% of the last 40 attempts failed")
	time.Sleep(1500 * time.Millisecond)
	before := gw.Ledger().Requests
	time.Sleep(2 * time.Second)
	t.Logf("circuit breaker tripped after %d requests", before)
	require.Equal(t, before, gw.Ledger().Requests, "a tripped task sends nothing")
	require.LessOrEqual(t, before, 40+8+20, "stops within the window plus what was in flight")
}

// TestScheduledTaskStartsOnTime keeps a send_at task scheduled, then
// checks its first send comes within a second of send_at.
func TestScheduledTaskStartsOnTime(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	sendAt := time.Now().Add(4 * time.Second).Truncate(time.Second)
	harness.Submit(t, ts, contract.Task{ID: "sched", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("s", 20), SendAt: sendAt.UTC().Format(time.RFC3339)})
	p := ts.WaitProgress(t, "sched", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateScheduled })
	require.Equal(t, 20, p.Total)
	final := ts.WaitFinal(t, "sched", 20*time.Second)
	first := gw.FirstArrival()
	t.Logf("scheduled start: first send %s after send_at", first.Sub(sendAt).Round(time.Millisecond))
	require.False(t, first.Before(sendAt), "nothing is sent before send_at")
	require.Less(t, first.Sub(sendAt), time.Second)
	require.Equal(t, 20, final.Sent)
}

// TestScheduledStartFinishesAnInterruptedRelease: a scheduled start marks
// the task processing before it publishes the recipients (so none of its
// jobs is parked as "scheduled"); when ingest stopped between the two, the
// start message comes back and the release is finished, not ignored.
func TestScheduledStartFinishesAnInterruptedRelease(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	// Scheduled an hour ahead, then left as a release cut short leaves it:
	// released and processing, nothing published.
	sendAt := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	harness.Submit(t, ts, contract.Task{ID: "cut", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("c", 20), SendAt: sendAt.Format(time.RFC3339)})
	ts.WaitProgress(t, "cut", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateScheduled })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tasks, err := ts.JS.KeyValue(ctx, contract.BucketTasks)
	require.NoError(t, err)
	e, err := tasks.Get(ctx, "cut")
	require.NoError(t, err)
	var rec contract.TaskRecord
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	rec.Released = true
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	_, err = tasks.Put(ctx, "cut", data)
	require.NoError(t, err)
	controls, err := ts.JS.KeyValue(ctx, contract.BucketControl)
	require.NoError(t, err)
	require.NoError(t, shared.PutControl(ctx, controls, "cut", contract.Control{State: contract.StateProcessing}))

	// The start message, as its redelivery brings it.
	_, err = ts.JS.Publish(ctx, contract.SubjectStartPrefix+"cut", []byte("cut"))
	require.NoError(t, err)
	final := ts.WaitFinal(t, "cut", 20*time.Second)
	require.Equal(t, contract.StateSucceeded, final.State)
	require.Equal(t, 20, final.Sent)
	require.Equal(t, 20, gw.Ledger().AcceptedKeys())
}
