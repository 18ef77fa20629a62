package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestPausedTaskIsNotCheckpointedEverySecond: a paused task's progress is
// still rewritten every second (rate, ETA, updated_at), but its fold state,
// unchanged, is not saved again: before, every paused task was
// checkpointed every second, a 1M-recipient one included.
func TestPausedTaskIsNotCheckpointedEverySecond(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "ck", harness.WebhookAccount(gw.URL, `"rate_per_sec":20,"burst":1,"concurrency":2`))
	p := pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	task := contract.Task{ID: "ckpt", Channel: "webhook", Template: "hi", Recipients: pipelinetest.Recipients("k", 200)}
	harness.Submit(t, ts, task)
	harness.WaitCount(t, 10*time.Second, 3, func() int { return gw.Ledger().Accepted }, "first sends")
	require.True(t, harness.Control(t, ts, task.ID, contract.ActionPause).OK)
	ts.WaitProgress(t, task.ID, 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused })
	time.Sleep(1500 * time.Millisecond) // in-flight outcomes land and are saved

	before, first := p.Status.CheckpointsSaved(), ts.Progress(t, task.ID)
	time.Sleep(3 * time.Second)
	after, last := p.Status.CheckpointsSaved(), ts.Progress(t, task.ID)
	t.Logf("paused 3 s: %d checkpoints saved, progress updated_at moved %s", after-before, last.UpdatedAt.Sub(first.UpdatedAt).Round(time.Millisecond))
	require.Zero(t, after-before, "an idle paused task is not checkpointed")
	require.GreaterOrEqual(t, last.UpdatedAt.Sub(first.UpdatedAt), 2*time.Second, "its progress stays live")
}
