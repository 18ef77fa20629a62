package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// queueJobGroups publishes the n jobs of task on account's normal lane in
// messages of size jobs each (the last may be shorter), as render does;
// recipients listed in permanent are named so the sandbox rejects them.
func queueJobGroups(t *testing.T, js jetstream.JetStream, task, account string, n, size int, permanent map[int]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for first := 0; first < n; first += size {
		var parts [][]byte
		for i := first; i < min(first+size, n); i++ {
			to := fmt.Sprintf("user-%d", i)
			if permanent[i] {
				to = fmt.Sprintf("bad-%d", i)
			}
			job := contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i, To: to,
				Body: "hi", Channel: "sandbox", Account: account, Priority: contract.PriorityNormal, MaxAttempts: 30}
			data, err := contract.EncodeJob(&job)
			require.NoError(t, err)
			parts = append(parts, data)
		}
		_, err := js.Publish(ctx, contract.JobSubject(account, contract.PriorityNormal), contract.JoinJobs(parts),
			jetstream.WithMsgID(contract.GroupMsgID(contract.JobID(task, first, false), len(parts))))
		require.NoError(t, err)
	}
}

// outcomesByJob counts task's events by kind and job.
func outcomesByJob(evs []contract.Event) map[contract.EventKind]map[string]int {
	out := map[contract.EventKind]map[string]int{}
	for _, e := range evs {
		if out[e.Kind] == nil {
			out[e.Kind] = map[string]int{}
		}
		out[e.Kind][e.JobID]++
	}
	return out
}

// TestJobGroupsSendEachJobOnce: jobs delivered eight to a message, a
// third of the calls failing and some recipients rejected for good: each
// job ends once (sent or failed with a dead letter), the failed sends come
// back alone as scheduled copies, and every message leaves JOBS.
func TestJobGroupsSendEachJobOnce(t *testing.T) {
	js := topologytest.Start(t).JS
	const task, n = "groups", 80
	permanent := map[int]bool{3: true, 17: true, 42: true, 79: true}
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":2000,"burst":50,"concurrency":4,"fail_rate":0.3,"permanent_prefix":"bad"}`})
	queueJobGroups(t, js, task, "acct", n, 8, permanent)
	runService(t, js, Config{BackoffBase: 10 * time.Millisecond})

	var evs []contract.Event
	require.Eventually(t, func() bool {
		evs = taskEvents(t, js, task)
		by := outcomesByJob(evs)
		return len(by[contract.EventSent])+len(by[contract.EventFailed]) == n
	}, 60*time.Second, 200*time.Millisecond, "every job ends")
	time.Sleep(500 * time.Millisecond) // a repeat would show by now
	evs = taskEvents(t, js, task)
	by := outcomesByJob(evs)
	require.Len(t, by[contract.EventSent], n-len(permanent))
	require.Len(t, by[contract.EventFailed], len(permanent))
	for id, k := range by[contract.EventSent] {
		require.Equal(t, 1, k, "job %s sent once", id)
		require.Zero(t, by[contract.EventFailed][id], "job %s sent and failed", id)
	}
	for i := range permanent {
		require.Equal(t, 1, by[contract.EventFailed][contract.JobID(task, i, false)], "job %d failed once", i)
	}
	require.NotEmpty(t, by[contract.EventRetrying], "some sends were retried")

	ctx := t.Context()
	dead, err := js.Stream(ctx, contract.StreamDead)
	require.NoError(t, err)
	info, err := dead.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(permanent), info.State.Msgs, "a dead letter per job given up")
	require.Eventually(t, func() bool {
		jobs, err := js.Stream(ctx, contract.StreamJobs)
		require.NoError(t, err)
		info, err := jobs.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs == 0
	}, 10*time.Second, 100*time.Millisecond, "every message acknowledged")
}

// TestJobGroupStoppedHalfwayIsNotRepeated: a process stops while a
// group's jobs wait for their turn (the account sends 4 a second): the
// parts sent and the part given up are done, the others send the message
// back. Its redelivery, to the next process, sends only those: each job
// is sent once, and the one given up has one failed event and one dead
// letter.
func TestJobGroupStoppedHalfwayIsNotRepeated(t *testing.T) {
	js := topologytest.Start(t).JS
	const task, n = "grouphalf", 12
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":4,"burst":1,"concurrency":4,"permanent_prefix":"bad"}`})
	queueJobGroups(t, js, task, "acct", n, n, map[int]bool{0: true})

	svc, err := New(js, Config{BackoffBase: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	require.Eventually(t, func() bool {
		return len(outcomesByJob(taskEvents(t, js, task))[contract.EventSent]) >= 3
	}, 20*time.Second, 50*time.Millisecond, "some of the group is sent")
	stop()
	<-done
	by := outcomesByJob(taskEvents(t, js, task))
	sentFirst := len(by[contract.EventSent])
	require.Less(t, sentFirst, n-1, "the stop came halfway")

	runService(t, js, Config{BackoffBase: 10 * time.Millisecond})
	require.Eventually(t, func() bool {
		return len(outcomesByJob(taskEvents(t, js, task))[contract.EventSent]) == n-1
	}, 30*time.Second, 100*time.Millisecond, "the rest is sent")
	time.Sleep(500 * time.Millisecond)
	by = outcomesByJob(taskEvents(t, js, task))
	for id, k := range by[contract.EventSent] {
		require.Equal(t, 1, k, "job %s sent once", id)
	}
	require.Equal(t, map[string]int{contract.JobID(task, 0, false): 1}, by[contract.EventFailed])
	dead, err := js.Stream(t.Context(), contract.StreamDead)
	require.NoError(t, err)
	info, err := dead.Info(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "one dead letter")
}

// TestJobsLeftAtAStopAreNotMaybeSent: a group stopped halfway, and jobs
// alone stopped while they waited for their turns, come back after the
// stop knowing they were never sent: cancelled then, their events do not
// say maybe_sent (which would also keep their frequency-cap reservations
// for the window).
func TestJobsLeftAtAStopAreNotMaybeSent(t *testing.T) {
	for _, size := range []int{12, 1} {
		t.Run(fmt.Sprintf("jobs a message %d", size), func(t *testing.T) {
			js := topologytest.Start(t).JS
			task, n := fmt.Sprintf("left%d", size), 12
			putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":4,"burst":1,"concurrency":4}`})
			svc, err := New(js, Config{BackoffBase: 10 * time.Millisecond})
			require.NoError(t, err)
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- svc.Run(ctx) }()
			// Queued once the account's lane exists, as render's jobs
			// come to a running dispatch: fresh, known never delivered.
			require.Eventually(t, func() bool { return laneExists(t, js, "acct", contract.PriorityNormal) }, 10*time.Second, 20*time.Millisecond)
			queueJobGroups(t, js, task, "acct", n, size, nil)
			require.Eventually(t, func() bool {
				return len(outcomesByJob(taskEvents(t, js, task))[contract.EventSent]) >= 3
			}, 20*time.Second, 50*time.Millisecond, "some of the jobs are sent")
			stop()
			<-done
			sent := len(outcomesByJob(taskEvents(t, js, task))[contract.EventSent])
			require.Less(t, sent, n-1, "the stop came halfway")

			kv, err := js.KeyValue(t.Context(), contract.BucketControl)
			require.NoError(t, err)
			require.NoError(t, shared.PutControl(t.Context(), kv, task, contract.Control{State: contract.StateCancelled}))
			runService(t, js, Config{BackoffBase: 10 * time.Millisecond})
			var cancelled []contract.Event
			require.Eventually(t, func() bool {
				cancelled = cancelled[:0]
				for _, e := range taskEvents(t, js, task) {
					if e.Kind == contract.EventCancelled {
						cancelled = append(cancelled, e)
					}
				}
				return len(cancelled) == n-sent
			}, 30*time.Second, 100*time.Millisecond, "the rest is cancelled")
			maybe := 0
			for _, e := range cancelled {
				if e.MaybeSent {
					maybe++
				}
			}
			t.Logf("%d sent before the stop, %d cancelled after it, %d of them maybe_sent", sent, len(cancelled), maybe)
			// One call at a time (burst 1): the job whose call the stop
			// caught may have been sent, its outcome lost; every other
			// job left at the stop never made its call.
			require.LessOrEqual(t, maybe, 1, "no job left at the stop but the one in its call says maybe_sent")
		})
	}
}

// TestJobGroupLanesHoldWhatPacingStartsSoon: a lane of job groups holds
// its burst and a tenth of a second of its rate (at least one job) in
// jobs waiting for their turns, at most its messages' worth at render's
// group size; a batch account's lanes hold what their calls fill.
func TestJobGroupLanesHoldWhatPacingStartsSoon(t *testing.T) {
	for _, c := range []struct {
		name string
		a    contract.Account
		want int
	}{
		{"fast", contract.Account{RatePerSec: 5000, Burst: 500, Concurrency: 256, MaxBatch: 1}, 500 + 500},
		{"slow", contract.Account{RatePerSec: 15, Burst: 1, Concurrency: 256, MaxBatch: 1}, 1 + 1},
		{"slower", contract.Account{RatePerSec: 2, Burst: 3, Concurrency: 256, MaxBatch: 1}, 3 + 1},
		{"unpaced", contract.Account{RatePerSec: contract.MaxRatePerSec, Burst: 1000, Concurrency: 256, MaxBatch: 1}, 256 * contract.DefaultJobGroupSize},
		{"one at a time", contract.Account{RatePerSec: 0.5, Burst: 0, Concurrency: 1, MaxBatch: 1}, 1},
		{"batch", contract.Account{RatePerSec: 1, Burst: 1, Concurrency: 4, MaxBatch: 100}, min(800*contract.DefaultJobGroupSize, maxJobsInFlight)},
	} {
		require.Equal(t, c.want, groupJobsWaiting(&c.a, contract.PriorityNormal), c.name)
	}
}
