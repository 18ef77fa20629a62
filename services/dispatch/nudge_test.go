package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDispatchNudgeWakesWaitingJobs: a job waiting for a turn that does
// not come wakes when nudged (a task's run state changed), long before
// its turnCheck, and a nudge before it waits does not end a later wait.
func TestDispatchNudgeWakesWaitingJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// No lease and no run loop: nothing is ever granted.
	s := newScheduler(newPacer(1, 1, 1), 1)
	var n nudger
	n.nudge() // nobody waits: nothing to wake, and no harm

	early := n.nudged()
	n.nudge()
	select {
	case <-early:
	default:
		t.Fatal("a nudge did not close the channel taken before it")
	}

	tk := s.begin(laneNormal)
	go func() {
		time.Sleep(100 * time.Millisecond)
		n.nudge()
	}()
	began := time.Now()
	ok, err := tk.wait(ctx, turnCheck, n.nudged())
	waited := time.Since(began)
	require.NoError(t, err)
	require.False(t, ok, "nothing grants a turn here")
	require.GreaterOrEqual(t, waited, 100*time.Millisecond, "woke before the nudge")
	require.Less(t, waited, turnCheck/2, "the nudge did not wake the waiting job")

	// Without a nudge the wait lasts its maxWait.
	began = time.Now()
	ok, err = tk.wait(ctx, 200*time.Millisecond, n.nudged())
	require.NoError(t, err)
	require.False(t, ok)
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond)
}
