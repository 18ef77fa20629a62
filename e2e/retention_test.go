package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// TestLiveTasksOutliveRetention runs with a 6 s retention (30 days in
// production): a task paused for twice that stays paused (its run state
// expired before, the sweeper then read it as running and sent its parked
// jobs) and finishes once resumed; a task awaiting approval past five
// sixths of the retention is cancelled with the reason instead of staying
// unapprovable forever. The keep-alive rewrites records older than 500 ms,
// so a record expires only after a stall of five seconds; with 4 s a
// loaded CI machine (three test packages at once on two cores) once
// stalled ingest long enough.
func TestLiveTasksOutliveRetention(t *testing.T) {
	t.Parallel()
	const retention = 6 * time.Second
	ts := pipelinetest.StartWithTopology(t, shared.TopologyConfig{Retention: retention})
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "ret", harness.WebhookAccount(gw.URL, `"rate_per_sec":20,"burst":1,"concurrency":2`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Ingest: ingest.Config{KeepAliveEvery: 500 * time.Millisecond}})

	paused := contract.Task{ID: "ret-paused", Channel: "webhook", Template: "hi", Recipients: pipelinetest.Recipients("p", 60)}
	harness.Submit(t, ts, paused)
	harness.WaitCount(t, 10*time.Second, 3, func() int { return gw.Ledger().Accepted }, "first sends")
	require.True(t, harness.Control(t, ts, paused.ID, contract.ActionPause).OK)
	approval := contract.Task{ID: "ret-approval", Channel: "webhook", Template: "hi", Recipients: pipelinetest.Recipients("a", 5),
		TestRecipients: pipelinetest.Recipients("qa", 1)}
	harness.Submit(t, ts, approval)

	time.Sleep(time.Second) // sends in flight at the pause land
	before := gw.Ledger().Accepted
	time.Sleep(2 * retention)
	during := gw.Ledger().Accepted - before
	e, err := harness.KVGet(t, ts, contract.BucketControl, paused.ID)
	require.NoError(t, err, "the paused task's run state outlived the retention")
	var ctl contract.Control
	require.NoError(t, json.Unmarshal(e.Value(), &ctl))
	_, err = harness.KVGet(t, ts, contract.BucketTasks, paused.ID)
	require.NoError(t, err, "its record too")
	a := ts.Progress(t, approval.ID)
	t.Logf("paused %s (twice the retention): %d sends meanwhile, state %s; awaiting approval: %s, error %q",
		2*retention, during, ctl.State, a.State, a.Error)
	require.Zero(t, during, "a paused task stays paused")
	require.Equal(t, contract.StatePaused, ctl.State)
	require.Equal(t, contract.StateCancelled, a.State)
	require.Equal(t, 5, a.Cancelled)
	require.Contains(t, a.Error, "not approved within")

	require.True(t, harness.Control(t, ts, paused.ID, contract.ActionResume).OK)
	p := ts.WaitFinal(t, paused.ID, 20*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 60, p.Sent)
}

// TestFinishedTasksAreForgotten: with a 2 s status retention a finished
// task's progress and checkpoint are removed once it has been finished that
// long; a paused task of the same age is kept.
func TestFinishedTasksAreForgotten(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "fg", harness.WebhookAccount(gw.URL, `"rate_per_sec":50,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Status: status.Config{Retention: 2 * time.Second}})
	done := contract.Task{ID: "fg-done", Channel: "webhook", Template: "hi", Recipients: pipelinetest.Recipients("d", 5)}
	harness.Submit(t, ts, done)
	ts.WaitFinal(t, done.ID, 10*time.Second)
	live := contract.Task{ID: "fg-live", Channel: "webhook", Template: "hi", Recipients: pipelinetest.Recipients("l", 500)}
	harness.Submit(t, ts, live)
	harness.WaitCount(t, 10*time.Second, 10, func() int { return gw.Ledger().Accepted }, "first sends of the live task")
	require.True(t, harness.Control(t, ts, live.ID, contract.ActionPause).OK)
	finished := time.Now()

	obs, err := ts.JS.ObjectStore(context.Background(), contract.BucketStatus)
	require.NoError(t, err)
	natstest.Eventually(t, 10*time.Second, func() bool {
		_, err := harness.KVGet(t, ts, contract.BucketProgress, done.ID)
		return err != nil
	}, "the finished task's progress is removed")
	gone := time.Since(finished)
	_, err = obs.GetInfo(context.Background(), done.ID)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound, "and its checkpoint")
	p := ts.Progress(t, live.ID)
	t.Logf("finished task removed %s after it finished (retention 2 s); the paused one kept: %s", gone.Round(100*time.Millisecond), p.State)
	require.Equal(t, contract.StatePaused, p.State)
	require.Greater(t, gone, 1500*time.Millisecond, "not before its retention")
}
