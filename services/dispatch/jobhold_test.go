package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestTwoMessagesOfOneJobSendOnce: a job queued twice (re-queued again
// after the stream's duplicate window forgot the first, say), both
// messages delivered at once: each is checked for an earlier send, but
// checked side by side both found none and both sent. The second waits
// for the first to be settled and then finds its sent event.
func TestTwoMessagesOfOneJobSendOnce(t *testing.T) {
	js := topologyJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const task, n = "twice", 8
	for i := range n {
		job := contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i, To: fmt.Sprintf("user-%d", i),
			Body: "hi", Channel: "sandbox", Account: "acct", Priority: contract.PriorityNormal, MaxAttempts: 3, Recheck: true}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		for range 2 {
			_, err = js.Publish(ctx, contract.JobSubject("acct", contract.PriorityNormal), data)
			require.NoError(t, err)
		}
	}
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":16}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return sentEvents(t, js, task) >= n }, 20*time.Second, 50*time.Millisecond)
	jobs, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := jobs.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs == 0
	}, 20*time.Second, 50*time.Millisecond, "both messages of each job are acknowledged")
	require.EqualValues(t, n, sentEvents(t, js, task), "each job sent once")
}
