package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestTwoMessagesOfOneJobSendOnce: a job queued twice (re-queued again
// after the stream's duplicate window forgot the first, say), both
// messages delivered at once: each is checked for an earlier send, but
// checked side by side both found none and both sent. The second waits
// for the first to be settled and then finds its sent event.
func TestTwoMessagesOfOneJobSendOnce(t *testing.T) {
	js := topologytest.Start(t).JS
	const task, n = "twice", 8
	for range 2 {
		publishJobs(t, js, task, n, true)
	}
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":16}`})
	runService(t, js, Config{})
	requireSentOnce(t, js, task, n)
}

// TestJobPublishedAgainWhileItsFirstIsSentSendsOnce: a first delivery
// straight from render is not checked; the message published again
// meanwhile is, but while the first is being sent it found no send
// (multi-process scenario seeds 323429555 and 712366452). It waits for
// the first, whichever comes first is not checked.
func TestJobPublishedAgainWhileItsFirstIsSentSendsOnce(t *testing.T) {
	js := topologytest.Start(t).JS
	const task, n = "again-while-sent", 8
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":16,"latency":"300ms"}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return laneExists(t, js, "acct", contract.PriorityNormal) },
		20*time.Second, 20*time.Millisecond, "the account's lane is open")
	publishJobs(t, js, task, n, false) // fresh: sent without a check
	time.Sleep(100 * time.Millisecond) // in the provider call now
	publishJobs(t, js, task, n, true)  // published again: checked
	requireSentOnce(t, js, task, n)
}

// TestJobPublishedAgainOvertakingItsFirstSendsOnce: the message
// published again is sent and settled before the first one is delivered
// (a later part of a job group begins late; multi-process scenario seed
// 596367550). The first, a first delivery that holds no other message,
// finds the mark the other left and is checked.
func TestJobPublishedAgainOvertakingItsFirstSendsOnce(t *testing.T) {
	js := topologytest.Start(t).JS
	const task, n = "overtaken", 8
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":16}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return laneExists(t, js, "acct", contract.PriorityNormal) },
		20*time.Second, 20*time.Millisecond, "the account's lane is open")
	publishJobs(t, js, task, n, true) // published again, sent first
	require.Eventually(t, func() bool { return sentEvents(t, js, task) >= n }, 20*time.Second, 20*time.Millisecond)
	publishJobs(t, js, task, n, false) // the first, delivered after
	requireSentOnce(t, js, task, n)
}

// publishJobs queues jobs 0..n-1 of task for account acct, recheck set
// as render sets it for a batch rendered again.
func publishJobs(t *testing.T, js jetstream.JetStream, task string, n int, recheck bool) {
	t.Helper()
	for i := range n {
		job := contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i, To: fmt.Sprintf("user-%d", i),
			Body: "hi", Channel: "sandbox", Account: "acct", Priority: contract.PriorityNormal, MaxAttempts: 3, Recheck: recheck}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = js.Publish(t.Context(), contract.JobSubject("acct", contract.PriorityNormal), data)
		require.NoError(t, err)
	}
}

// requireSentOnce waits until JOBS is empty and checks that each of the
// task's n jobs has one sent event (they name the message that sent them,
// so two sends of a job are two events).
func requireSentOnce(t *testing.T, js jetstream.JetStream, task string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.Eventually(t, func() bool { return sentEvents(t, js, task) >= uint64(n) }, 20*time.Second, 50*time.Millisecond)
	jobs, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := jobs.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs == 0
	}, 20*time.Second, 50*time.Millisecond, "both messages of each job are acknowledged")
	require.EqualValues(t, n, sentEvents(t, js, task), "each job sent once")
}

// TestJobHoldMarksStayBounded: marks expire, and a shard keeps at most
// maxMarks of them.
func TestJobHoldMarksStayBounded(t *testing.T) {
	t.Parallel()
	h := newJobHolds()
	for i := range holdShards * maxMarks * 2 {
		id := fmt.Sprintf("t.%d", i)
		held, another := h.hold(t.Context(), id, time.Second)
		require.False(t, another)
		h.release(id, held, true)
	}
	total := 0
	for i := range h.shards {
		require.LessOrEqual(t, len(h.shards[i].marks), maxMarks)
		total += len(h.shards[i].marks)
	}
	require.Greater(t, total, holdShards*maxMarks/2)
	id := fmt.Sprintf("t.%d", holdShards*maxMarks*2-1)
	held, another := h.hold(t.Context(), id, time.Second)
	require.True(t, another, "the last one marked is found")
	h.release(id, held, false)

	sh := h.shard(id)
	sh.mu.Lock()
	sh.marks[id] = time.Now().Add(-markKeep)
	sh.mu.Unlock()
	held, another = h.hold(t.Context(), id, time.Second)
	require.False(t, another, "an expired mark counts for nothing")
	h.release(id, held, false)
}
