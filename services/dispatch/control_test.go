package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// TestResumedTaskIsNotParkedByAStaleView: dispatch's view of the run
// states lags (its watch fell behind, as under CI's load, where a resumed
// task sent nothing for 10 s in TestDashboardInABrowser). A job of the
// resumed task must be sent, not parked again on the view's word, and the
// view is brought up to the bucket.
func TestResumedTaskIsNotParkedByAStaleView(t *testing.T) {
	g := newHandoffRig(t)
	const task = "staleview"
	g.setControl(t, task, contract.StatePaused)
	// A view frozen at "paused": its watch stops right after loading.
	watching, stopWatch := context.WithCancel(t.Context())
	stale, err := shared.WatchControl(watching, g.js, g.svc.log, nil)
	require.NoError(t, err)
	stopWatch()
	g.svc.controls = stale
	time.Sleep(100 * time.Millisecond)

	kv, err := g.js.KeyValue(t.Context(), contract.BucketControl)
	require.NoError(t, err)
	require.NoError(t, shared.PutControl(t.Context(), kv, task, contract.Control{State: contract.StateProcessing}))
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, contract.StatePaused, g.svc.controls.Get(task).State, "the view is stale")

	queueJobs(t, g.js, task, "a", 1)
	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.False(t, g.mayStillSend(t, d), "the job goes on to its send")
	require.Zero(t, g.count(t, contract.ParkedSubject(task, "a")), "nothing parked")
	require.Equal(t, contract.StateProcessing, g.svc.controls.Get(task).State, "the view caught up with the bucket")
}
