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

// TestDispatchChecksJobsQueuedBeforeItsConsumer: the lanes' consumers keep
// their state in memory, so a server restart loses them with every
// delivery count, and a job that was sent but not acknowledged comes back
// as a first delivery. A job queued before its consumer was created is
// therefore checked for a sent event before it is sent: half the jobs here
// have one (sent before the "restart") and must not be sent again.
func TestDispatchChecksJobsQueuedBeforeItsConsumer(t *testing.T) {
	js := topologyJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n, sentBefore = 10, 5
	queueJobs(t, js, "again", "acct", n)
	for i := range sentBefore {
		ev := contract.Event{TaskID: "again", JobID: contract.JobID("again", i, false), To: fmt.Sprintf("user-%d", i),
			Account: "acct", Kind: contract.EventSent, Attempt: 1, Index: i, At: time.Now().UTC()}
		data, err := json.Marshal(&ev)
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.EventSubject("again", contract.EventSent), data)
		require.NoError(t, err)
	}
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return sentEvents(t, js, "again") >= n }, 20*time.Second, 50*time.Millisecond, "the other jobs are sent")
	time.Sleep(time.Second)
	require.EqualValues(t, n, sentEvents(t, js, "again"), "the jobs sent before are not sent again")
}
