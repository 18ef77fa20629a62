package render

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestBatchesOverTheBudgetRenderOneAtATime: two batches, each larger than
// RecipientsInFlight, wait together for a render with four workers; each
// takes the whole budget (a batch larger than it still renders), so the
// second starts only when the first has published all its jobs, and JOBS
// holds one task's jobs, then the other's. (A batch that took a weight of
// one left 8 and 64 runs.)
func TestBatchesOverTheBudgetRenderOneAtATime(t *testing.T) {
	require.Equal(t, 2, runsOfTasks(t, 1000), "one task's jobs, then the other's")
}

// runsOfTasks renders two tasks' batches of 3,000 recipients, published
// before render starts, with budget recipients in flight and a job a
// message, and returns how many runs of one task's jobs JOBS holds in
// stream order.
func runsOfTasks(t *testing.T, budget int) int {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	accounts, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = accounts.Put(ctx, "a", []byte(`{"channel":"sandbox"}`))
	require.NoError(t, err)
	tasks, err := js.KeyValue(ctx, contract.BucketTasks)
	require.NoError(t, err)
	const n = 3000
	for _, task := range []string{"first", "second"} {
		rec, _ := json.Marshal(contract.TaskRecord{Task: contract.Task{ID: task, Channel: "sandbox", Template: "hi {{.name}}", MaxAttempts: 3, Priority: contract.PriorityNormal}})
		_, err = tasks.Put(ctx, task, rec)
		require.NoError(t, err)
		batch := contract.RenderBatch{TaskID: task}
		for i := range n {
			batch.Recipients = append(batch.Recipients, contract.BatchRecipient{To: fmt.Sprintf("user-%d", i), Vars: map[string]any{"name": i}})
		}
		data, _ := json.Marshal(batch)
		_, err = js.Publish(ctx, contract.RenderSubject(task), data)
		require.NoError(t, err)
	}

	runService(t, js, Config{Concurrency: 4, RecipientsInFlight: budget, JobsPerMessage: 1})

	jobs, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := jobs.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs == 2*n
	}, 30*time.Second, 50*time.Millisecond, "every job stored")

	runs, last := 0, ""
	for _, m := range natstest.StoredMsgs(t, js, contract.StreamJobs) {
		var j contract.Job
		require.NoError(t, contract.DecodeJob(m.Data, &j))
		if j.TaskID != last {
			runs, last = runs+1, j.TaskID
		}
	}
	return runs
}
