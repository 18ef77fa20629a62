package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// queueLaneJobs publishes sandbox jobs from..from+n-1 of task on account's
// lane of priority p.
func queueLaneJobs(t *testing.T, js jetstream.JetStream, task, account string, p contract.Priority, from, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		job := contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i, To: fmt.Sprintf("user-%d", i),
			Body: "hi", Channel: "sandbox", Account: account, Priority: p, MaxAttempts: 3}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.JobSubject(account, p), data)
		require.NoError(t, err)
	}
}

// laneExists reports whether account's consumer of priority p exists.
func laneExists(t *testing.T, js jetstream.JetStream, account string, p contract.Priority) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, p))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

// laneMetadata returns the metadata of account's consumer of lane p.
func laneMetadata(t *testing.T, js jetstream.JetStream, account string, p contract.Priority) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, p))
	require.NoError(t, err)
	return c.CachedInfo().Config.Metadata
}

// closedMarks returns the closed marks on account's normal lane.
func closedMarks(t *testing.T, js jetstream.JetStream, account string) map[contract.Priority]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, contract.PriorityNormal))
	require.NoError(t, err)
	marks := map[contract.Priority]bool{}
	for _, p := range contract.Priorities {
		if c.CachedInfo().Config.Metadata[closedMark(p)] != "" {
			marks[p] = true
		}
	}
	return marks
}

// openLaneState returns the open lane of account in svc, nil when closed.
func openLaneState(svc *Service, account string, lane int) *openLane {
	svc.mu.Lock()
	r := svc.runners[account]
	svc.mu.Unlock()
	if r == nil {
		return nil
	}
	sl := r.lanes.Load()
	if sl == nil {
		return nil
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.open[lane]
}

// TestLanesOpenForJobsAndCloseWhenIdle: an account without high or low
// jobs has only its normal lane's consumer, with the other two lanes
// marked closed on it; high jobs open the high lane, are handled as fresh
// (the mark proves nobody delivered them), and the lane closes again once
// idle, mark back.
func TestLanesOpenForJobsAndCloseWhenIdle(t *testing.T) {
	old := laneIdleClose
	laneIdleClose = 2 * time.Second
	t.Cleanup(func() { laneIdleClose = old })
	js := topologytest.Start(t).JS
	putAccounts(t, js, map[string]string{"lanes": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	svc := runService(t, js, Config{})

	require.Eventually(t, func() bool { return laneExists(t, js, "lanes", contract.PriorityNormal) }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		m := closedMarks(t, js, "lanes")
		return m[contract.PriorityHigh] && m[contract.PriorityLow]
	}, 5*time.Second, 20*time.Millisecond, "high and low are marked closed")
	require.False(t, laneExists(t, js, "lanes", contract.PriorityHigh))
	require.False(t, laneExists(t, js, "lanes", contract.PriorityLow))

	const n = 20
	queueLaneJobs(t, js, "hi", "lanes", contract.PriorityHigh, 0, n)
	var opened *openLane
	require.Eventually(t, func() bool {
		// Sends first: the lane may open and send every job while a look
		// at the events is on its way, and it stays open laneIdleClose
		// after its last job.
		sent := sentEvents(t, js, "hi") >= n
		if ol := openLaneState(svc, "lanes", laneHigh); ol != nil {
			opened = ol
		}
		return sent
	}, 10*time.Second, 5*time.Millisecond, "the high jobs are sent")
	require.NotNil(t, opened, "the high lane opened")
	require.Zero(t, opened.recheckThrough, "jobs of a lane opened after its mark are fresh")
	require.False(t, closedMarks(t, js, "lanes")[contract.PriorityHigh], "the mark is down while the lane is open")
	require.True(t, closedMarks(t, js, "lanes")[contract.PriorityLow], "the low lane stays marked")

	require.Eventually(t, func() bool {
		return !laneExists(t, js, "lanes", contract.PriorityHigh) && closedMarks(t, js, "lanes")[contract.PriorityHigh]
	}, 3*laneIdleClose+5*time.Second, 50*time.Millisecond, "the idle high lane closes, marked")
	time.Sleep(500 * time.Millisecond)
	require.EqualValues(t, n, sentEvents(t, js, "hi"), "each job sent once")
	require.Equal(t, "0", laneMetadata(t, js, "lanes", contract.PriorityNormal)[recheckMark],
		"the normal lane's recheck mark (made on an empty stream) outlives the updates of its closed marks")
}

// TestLaneWithoutMarkChecksItsJobs: high jobs queued with no mark (as after
// a server restart lost the consumers and the marks with them) may have
// been sent by the lost consumer, so the lane that opens for them checks
// each for an earlier send: the half with a sent event are not sent again.
func TestLaneWithoutMarkChecksItsJobs(t *testing.T) {
	js := topologytest.Start(t).JS
	const n, sentBefore = 10, 5
	queueLaneJobs(t, js, "again-hi", "acct", contract.PriorityHigh, 0, n)
	publishSentEvents(t, js, "again-hi", indexesBelow(sentBefore)...)
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return sentEvents(t, js, "again-hi") >= n }, 20*time.Second, 50*time.Millisecond, "the other jobs are sent")
	time.Sleep(time.Second)
	require.EqualValues(t, n, sentEvents(t, js, "again-hi"), "the jobs sent before are not sent again")
	require.True(t, closedMarks(t, js, "acct")[contract.PriorityLow], "the empty low lane is marked closed")
	require.False(t, closedMarks(t, js, "acct")[contract.PriorityHigh], "the high lane, open, is not")
}
