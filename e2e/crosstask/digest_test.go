package crosstask

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// digestTemplate shows how many items a digest merged and each item's task
// and text, so a body says exactly what it carried.
const digestTemplate = `{{.count}} updates:{{range .items}} [{{.task_id}}] {{.body}};{{end}}`

// digestTask is a task of n recipients prefixed prefix with a digest key
// and window.
func digestTask(id, prefix string, n int, key, window string) contract.Task {
	return contract.Task{ID: id, Channel: "webhook", Template: "news of " + id + " for {{.to}}",
		Recipients: pipelinetest.Recipients(prefix, n), DigestKey: key, DigestWindow: window, DigestTemplate: digestTemplate}
}

// checkDigests asserts that tasks' sent events to each recipient were
// carried by one accepted request whose body holds every task's item:
// one sent event per task and recipient, all naming the same carrier, one
// of them the carrier's own with digest_size len(tasks).
func checkDigests(t *testing.T, ts *pipelinetest.Server, gw *harness.RecordedGateway, tasks []string, n int) {
	t.Helper()
	led := gw.Ledger()
	carriers := map[string]string{} // recipient -> carrier job id
	sizes := map[string]int{}
	began := map[string]time.Time{} // recipient -> the carrying call's start
	total := 0
	for _, id := range tasks {
		sent := harness.EventsOf(ts.Events(t, id), contract.EventSent)
		require.Len(t, sent, n, "sent events of %s", id)
		total += len(sent)
		for _, ev := range sent {
			require.NotEmpty(t, ev.CarriedBy, "sent event of %s to %s names no carrier", id, ev.To)
			if c, ok := carriers[ev.To]; ok {
				require.Equal(t, c, ev.CarriedBy, "recipient %s: items carried by different messages", ev.To)
			}
			carriers[ev.To] = ev.CarriedBy
			require.False(t, ev.CallStartedAt.IsZero(), "sent event of %s to %s has no call_started_at", id, ev.To)
			if b, ok := began[ev.To]; ok {
				require.True(t, b.Equal(ev.CallStartedAt), "recipient %s: one call, two starts", ev.To)
			}
			began[ev.To] = ev.CallStartedAt
			if ev.JobID == ev.CarriedBy {
				sizes[ev.To] = ev.DigestSize
			}
		}
	}
	require.Equal(t, len(tasks)*n, total)
	require.Len(t, carriers, n)
	for to, c := range carriers {
		require.Equal(t, len(tasks), sizes[to], "digest_size of the carrier to %s", to)
		require.Equal(t, 1, led.AcceptedByKey[c], "requests accepted for carrier %s", c)
		body := led.Bodies[c]
		require.True(t, strings.HasPrefix(body, fmt.Sprintf("%d updates:", len(tasks))), "body %q", body)
		for _, id := range tasks {
			require.Contains(t, body, "["+id+"] news of "+id+" for "+to+";")
		}
	}
}

// startDigestPipeline runs the pipeline with account "hook" sending to a
// recording gateway that injects no faults.
func startDigestPipeline(t *testing.T) (*pipelinetest.Server, *harness.RecordedGateway) {
	t.Helper()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":20,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())
	return ts, gw
}

// totals is the sum of the tasks' totals (a task without progress yet
// counts 0).
func totals(t *testing.T, ts *pipelinetest.Server, ids []string) int {
	n := 0
	for _, id := range ids {
		if p := ts.Progress(t, id); p != nil {
			n += p.Total
		}
	}
	return n
}

// TestDigestMergesTasks sends three tasks with one digest_key to the same
// ten recipients within the window: ten provider requests, each carrying
// the three items, thirty sent events naming their carrier, each task sent
// 10. A task with another key and one to other recipients are not merged
// with them.
func TestDigestMergesTasks(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)

	merged := []string{"dg-a", "dg-b", "dg-c"}
	for _, id := range merged {
		harness.Submit(t, ts, digestTask(id, "u", 10, "news", "4s"))
	}
	harness.Submit(t, ts, digestTask("dg-other-key", "u", 10, "alerts", "4s"))
	harness.Submit(t, ts, digestTask("dg-other-to", "v", 5, "news", "4s"))

	for _, id := range append(merged, "dg-other-key") {
		p := ts.WaitFinal(t, id, 30*time.Second)
		require.Equal(t, 10, p.Sent, "%s sent", id)
		require.Equal(t, 10, p.Total, "%s total", id)
	}
	require.Equal(t, 5, ts.WaitFinal(t, "dg-other-to", 30*time.Second).Sent)
	time.Sleep(500 * time.Millisecond) // nothing more may arrive

	led := gw.Ledger()
	require.Equal(t, 10+10+5, led.Requests, "provider requests: 10 digests of 3, 10 of the other key, 5 to other recipients")
	require.Equal(t, 0, led.Duplicates)
	checkDigests(t, ts, gw, merged, 10)
	checkDigests(t, ts, gw, []string{"dg-other-key"}, 10)
	checkDigests(t, ts, gw, []string{"dg-other-to"}, 5)
}

// TestDigestWithoutWindowSendsAlone: a digest_key without a window on an
// account without digest_backlog sends every message alone, as before.
func TestDigestWithoutWindowSendsAlone(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)
	for _, id := range []string{"dn-a", "dn-b"} {
		harness.Submit(t, ts, digestTask(id, "u", 5, "news", ""))
	}
	for _, id := range []string{"dn-a", "dn-b"} {
		require.Equal(t, 5, ts.WaitFinal(t, id, 30*time.Second).Sent)
		for _, ev := range harness.EventsOf(ts.Events(t, id), contract.EventSent) {
			require.Empty(t, ev.CarriedBy, "a message sent alone names no carrier")
		}
	}
	require.Equal(t, 10, gw.Ledger().Requests)
}

// TestDigestBacklogRule: on an account with digest_backlog 5, a job of a
// task with a digest_key and no window merges (with dispatch's
// DigestWindow) when more than 5 jobs are queued on the account as it is
// delivered, and goes alone otherwise. The burst is queued before a
// dispatch replica starts: three such tasks to ten recipients (each job
// with at least ten more behind it: 10 digests of 3), and ten jobs of a
// task without a key (alone). Queued while dispatch runs, a burst's first
// and last jobs would meet a queue of any length and the counts would be
// a race. Once the burst is sent, two more jobs with the key to two of
// the recipients find no queue: they go alone. (Queued behind the burst
// they would merge: render's job groups bring them to dispatch while the
// burst's jobs still wait for their turns, which count as queued.)
func TestDigestBacklogRule(t *testing.T) {
	t.Parallel()
	cfg := harness.FastRetries().Dispatch
	cfg.DigestWindow = 5 * time.Second // the tail is delivered before the first carrier is back
	e := harness.NewDispatchEnv(t, cfg)
	gw := harness.StartGateway(t, harness.GatewayOK())
	e.TS.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":20,"concurrency":4,"digest_backlog":5`))
	queue := func(n int, tasks ...contract.Task) {
		t.Helper()
		for _, task := range tasks {
			harness.Submit(t, e.TS, task)
		}
		natstest.Eventually(t, 20*time.Second, func() bool { return queuedJobs(t, e.TS, "hook") == n }, "%d jobs queued", n)
	}
	merged := []string{"db-a", "db-b", "db-c"}
	queue(30, digestTask("db-a", "u", 10, "news", ""), digestTask("db-b", "u", 10, "news", ""), digestTask("db-c", "u", 10, "news", ""))
	plain := digestTask("db-plain", "w", 10, "", "")
	plain.DigestTemplate = ""
	queue(40, plain)
	e.StartReplica()

	for _, id := range append(merged, "db-plain") {
		require.Equal(t, 10, e.TS.WaitFinal(t, id, 40*time.Second).Sent, "%s sent", id)
	}
	harness.Submit(t, e.TS, digestTask("db-tail", "u", 2, "news", ""))
	require.Equal(t, 2, e.TS.WaitFinal(t, "db-tail", 40*time.Second).Sent, "db-tail sent")
	time.Sleep(500 * time.Millisecond) // nothing more may arrive
	require.Equal(t, 10+10+2, gw.Ledger().Requests, "10 digests of 3, 10 jobs without a key, 2 jobs at the queue's tail alone")
	checkDigests(t, e.TS, gw, merged, 10)
	for _, id := range []string{"db-plain", "db-tail"} {
		for _, ev := range harness.EventsOf(e.TS.Events(t, id), contract.EventSent) {
			require.Empty(t, ev.CarriedBy, "%s to %s was sent alone", id, ev.To)
		}
	}
}

// queuedJobs is how many normal jobs JOBS holds for account, counting
// each job of a job group.
func queuedJobs(t *testing.T, ts *pipelinetest.Server, account string) int {
	t.Helper()
	subject := contract.JobSubject(account, contract.PriorityNormal)
	n := 0
	for _, m := range natstest.StoredMsgs(t, ts.JS, contract.StreamJobs) {
		if m.Subject == subject {
			n += len(contract.SplitJobs(m.Data))
		}
	}
	return n
}

// TestDigestSurvivesDispatchRestart stops the only dispatch replica in the
// middle of the window, after every job joined its digest, and starts a
// new one: still exactly ten provider requests and thirty sent events.
func TestDigestSurvivesDispatchRestart(t *testing.T) {
	t.Parallel()
	e := harness.NewDispatchEnv(t, harness.FastRetries().Dispatch)
	gw := harness.StartGateway(t, harness.GatewayOK())
	e.TS.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":20,"concurrency":4`))
	first := e.StartReplica()
	merged := []string{"dr-a", "dr-b", "dr-c"}
	for _, id := range merged {
		harness.Submit(t, e.TS, digestTask(id, "u", 10, "news", "5s"))
	}
	// Every job has joined a digest once the JOBS consumer holds none.
	natstest.Eventually(t, 20*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, e.TS.JS, "webhook") == 30
	}, "jobs joined their digests")
	require.Zero(t, gw.Ledger().Requests, "nothing sent before the window closed")
	first.Stop()
	e.StartReplica()
	for _, id := range merged {
		require.Equal(t, 10, e.TS.WaitFinal(t, id, 40*time.Second).Sent, "%s sent", id)
	}
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 10, gw.Ledger().Requests)
	checkDigests(t, e.TS, gw, merged, 10)
}

// TestDigestTwoReplicas runs the tasks' jobs on two accounts owned by two
// replicas, so the digests' entries are joined from both: still one
// request per recipient.
func TestDigestTwoReplicas(t *testing.T) {
	t.Parallel()
	e := harness.NewDispatchEnv(t, harness.FastRetries().Dispatch)
	gw := harness.StartGateway(t, harness.GatewayOK())
	for _, a := range []string{"hook-1", "hook-2"} {
		e.TS.PutAccount(t, a, harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":20,"concurrency":4`))
	}
	e.StartReplica()
	e.StartReplica()
	// Submitted before the second replica has its account, a task's jobs
	// may wait out the hand-over and miss the window.
	e.WaitAccountsApart("hook-1", "hook-2")
	merged := []string{"d2-a", "d2-b", "d2-c"}
	for i, id := range merged {
		task := digestTask(id, "u", 10, "news", "4s")
		task.Accounts = []string{[]string{"hook-1", "hook-2"}[i%2]}
		harness.Submit(t, e.TS, task)
	}
	for _, id := range merged {
		require.Equal(t, 10, e.TS.WaitFinal(t, id, 40*time.Second).Sent, "%s sent", id)
	}
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 10, gw.Ledger().Requests)
	checkDigests(t, e.TS, gw, merged, 10)
}

// TestDigestCancelKeepsOthers cancels the task that opened the digests
// during the window: its recipients get cancelled events, the other two
// tasks' items are still sent, merged.
func TestDigestCancelKeepsOthers(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)
	harness.Submit(t, ts, digestTask("dc-a", "u", 10, "news", "4s"))
	natstest.Eventually(t, 10*time.Second, func() bool { return totals(t, ts, []string{"dc-a"}) == 10 })
	time.Sleep(500 * time.Millisecond) // its jobs opened the digests
	for _, id := range []string{"dc-b", "dc-c"} {
		harness.Submit(t, ts, digestTask(id, "u", 10, "news", "4s"))
	}
	require.True(t, harness.Control(t, ts, "dc-a", contract.ActionCancel).OK)
	p := ts.WaitFinal(t, "dc-a", 30*time.Second)
	require.Equal(t, 10, p.Cancelled)
	require.Zero(t, p.Sent)
	for _, id := range []string{"dc-b", "dc-c"} {
		require.Equal(t, 10, ts.WaitFinal(t, id, 30*time.Second).Sent, "%s sent", id)
	}
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 10, gw.Ledger().Requests)
	checkDigests(t, ts, gw, []string{"dc-b", "dc-c"}, 10)
}

// TestDigestPauseTakesItemOut pauses a task that joined the digests during
// the window: the other two tasks are sent merged without it, and the
// paused task's recipients, resumed, are sent alone, each once.
func TestDigestPauseTakesItemOut(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)
	for _, id := range []string{"dp-a", "dp-b", "dp-c"} {
		harness.Submit(t, ts, digestTask(id, "u", 10, "news", "4s"))
	}
	// Paused once every job has joined its digest (a job paused before it
	// reached dispatch would be parked, and merge after its resume).
	natstest.Eventually(t, 10*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, ts.JS, "webhook") == 30
	})
	require.True(t, harness.Control(t, ts, "dp-b", contract.ActionPause).OK)
	for _, id := range []string{"dp-a", "dp-c"} {
		require.Equal(t, 10, ts.WaitFinal(t, id, 30*time.Second).Sent, "%s sent", id)
	}
	require.Zero(t, ts.Progress(t, "dp-b").Sent, "paused: nothing sent")
	require.Equal(t, 10, gw.Ledger().Requests)
	checkDigests(t, ts, gw, []string{"dp-a", "dp-c"}, 10)

	require.True(t, harness.Control(t, ts, "dp-b", contract.ActionResume).OK)
	require.Equal(t, 10, ts.WaitFinal(t, "dp-b", 30*time.Second).Sent)
	time.Sleep(500 * time.Millisecond)
	led := gw.Ledger()
	require.Equal(t, 20, led.Requests)
	require.Equal(t, 0, led.Duplicates)
	for _, ev := range harness.EventsOf(ts.Events(t, "dp-b"), contract.EventSent) {
		require.Empty(t, ev.CarriedBy, "taken out of the digest, sent alone")
		require.Equal(t, "news of dp-b for "+ev.To, led.Bodies[ev.JobID])
	}
}

// TestDigestFullOpensTheNext sends 51 tasks with one digest_key to one
// recipient: a digest merges at most 50, so the last waits for the first
// digest to be sent and opens the next: two requests, 50 items and 1.
func TestDigestFullOpensTheNext(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)
	n := contract.MaxDigestItems + 1
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("df-%02d", i)
		harness.Submit(t, ts, digestTask(ids[i], "u", 1, "news", "5s"))
	}
	for _, id := range ids {
		require.Equal(t, 1, ts.WaitFinal(t, id, 40*time.Second).Sent, "%s sent", id)
	}
	time.Sleep(500 * time.Millisecond)
	led := gw.Ledger()
	require.Equal(t, 2, led.Requests)
	sizes := map[int]int{}
	for _, id := range ids {
		for _, ev := range harness.EventsOf(ts.Events(t, id), contract.EventSent) {
			require.NotEmpty(t, ev.CarriedBy)
			if ev.CarriedBy == ev.JobID {
				sizes[ev.DigestSize]++
				require.True(t, strings.HasPrefix(led.Bodies[ev.JobID], fmt.Sprintf("%d updates:", ev.DigestSize)))
			}
		}
	}
	require.Equal(t, map[int]int{contract.MaxDigestItems: 1, 1: 1}, sizes, "digest sizes")
}
