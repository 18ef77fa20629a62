package process

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// TestStatusPartitionsSpreadAndSurviveAKill runs two status processes with
// STATUS_PARTITIONS=4 beside ingest, render and dispatch processes, and
// four tasks, one in each partition. The partitions must spread two and
// two over the processes; killing one (SIGKILL) mid-send must leave its
// partitions to the other, with every task's progress moving again within
// 3 s and never pausing 3 s while the killed process's last announcement
// is fresh; the restarted process must get two partitions back; every
// progress value must be monotonic and the final ones equal the gateway's
// ledger.
func TestStatusPartitionsSpreadAndSurviveAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process status partition test")
	}
	const (
		parts = 4
		n     = 800 // recipients per task
		rate  = 40  // per task: each has an account of its own
	)
	st := startStack(t, 2*time.Millisecond, 11)
	st.startAll("ingest", "render", "dispatch")
	replicas := st.replicas(2, "status", "STATUS_FLUSH_INTERVAL=250ms", fmt.Sprintf("STATUS_PARTITIONS=%d", parts))
	// holders counts the partitions each replica holds, by index in
	// replicas (-1: a lease nobody holds, or one of a killed process). It
	// reads each lease once: a lease may be handed on between two reads.
	holders := func() map[int]int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := st.c.js.KeyValue(ctx, contract.BucketLeases)
		require.NoError(t, err)
		count := map[int]int{}
		for k := range parts {
			i := -1
			if e, err := kv.Get(ctx, status.FoldLeaseKey(k, parts)); err == nil {
				for j, r := range replicas {
					if pid, ok := ownerPid(string(e.Value())); ok && r.Running() && pid == r.Pid() {
						i = j
					}
				}
			} else {
				require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
			}
			count[i]++
		}
		return count
	}
	spread := func() bool { h := holders(); return h[0] == parts/2 && h[1] == parts/2 }
	// waitHolders waits until cond holds, logging how long it took, or
	// the holders and the replicas' fold lines when it does not. It polls
	// in the test's goroutine: a require failing in holders inside
	// require.Eventually's condition would end only that goroutine, and
	// the wait would run to its timeout.
	waitHolders := func(what string, cond func() bool, timeout time.Duration) {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > timeout {
				t.Logf("holders by replica index (-1: none): %v", holders())
				for i, r := range replicas {
					t.Logf("replica %d (pid %d) fold lines:\n%s", i, r.Pid(), foldLines(r.Logs()))
				}
				t.Fatalf("%s: not within %s", what, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
	}
	waitHolders("the partitions spread two and two", spread, 30*time.Second)
	for k := range parts {
		st.c.putAccount(fmt.Sprintf("hook-%d", k), fmt.Sprintf(`{"channel":"webhook","endpoint":"%s/send","rate_per_sec":%d,"min_rate_per_sec":%d,"burst":10,"concurrency":8}`,
			st.gw.URL, rate, rate))
	}

	// One task in each partition, each on an account of its own, so all
	// four are being sent when the kill comes.
	var tasks []contract.Task
	for i := 0; len(tasks) < parts; i++ {
		id := fmt.Sprintf("parts-%d", i)
		if status.PartitionOf(id, parts) == len(tasks) {
			tasks = append(tasks, contract.Task{ID: id, Channel: "webhook", Template: "Hello {{.to}}",
				Accounts: []string{fmt.Sprintf("hook-%d", len(tasks))}, Recipients: pipelinetest.Recipients(id, n)})
		}
	}
	pw := watchProgress(t, st.c)
	var ids []string
	for _, task := range tasks {
		ids = append(ids, task.ID)
	}
	for _, task := range tasks {
		st.c.submitTask(task)
	}
	require.Eventually(t, func() bool {
		for _, task := range tasks {
			if v, ok := pw.last(task.ID); !ok || v.p.Sent < n/4 {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "a quarter of every task sent")

	victim := replicas[0]
	atKill := map[string]int{}
	for _, task := range tasks {
		v, _ := pw.last(task.ID)
		require.False(t, v.p.State.Final(), "%s is still being sent at the kill", task.ID)
		atKill[task.ID] = v.p.Sent
	}
	killedAt := time.Now()
	victim.Kill()
	gaps := map[string]time.Duration{}
	for len(gaps) < len(tasks) {
		for _, task := range tasks {
			if _, done := gaps[task.ID]; done {
				continue
			}
			if pw.movedSince(task.ID, killedAt, atKill[task.ID]) {
				v, _ := pw.last(task.ID)
				gaps[task.ID] = v.at.Sub(killedAt)
			}
		}
		if time.Since(killedAt) > 30*time.Second { // what each task did, for the failure below
			pw.logLast(t, killedAt, ids...)
			t.Logf("holders by replica index (-1: none): %v", holders())
			t.Logf("survivor's fold lines:\n%s", foldLines(replicas[1].Logs()))
		}
		require.Less(t, time.Since(killedAt), 30*time.Second, "progress of every task moves again after the kill (moved: %v)", gaps)
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("killed status pid %d: progress moving again after %v", victim.Pid(), gaps)
	waitHolders("the survivor folds every partition", func() bool { return holders()[1] == parts }, 15*time.Second)
	// Until the killed process no longer counts among the replicas
	// (lease.FairShare), the survivor must not leave a partition unfolded:
	// no task's progress may pause for 3 s in that time.
	watched := killedAt.Add(6 * time.Second)
	time.Sleep(time.Until(watched))
	longest := map[string]time.Duration{}
	for _, task := range tasks {
		longest[task.ID] = pw.longestGap(task.ID, killedAt, watched)
	}
	t.Logf("longest pause of progress in the %v after the kill: %v", watched.Sub(killedAt), longest)
	for _, g := range longest {
		if g >= 3*time.Second {
			t.Logf("survivor's fold lines:\n%s", foldLines(replicas[1].Logs()))
			break
		}
	}
	victim.Restart()
	waitHolders("the restarted process gets its share back", spread, 30*time.Second)

	for _, task := range tasks {
		p := st.c.pollProgress(task.ID, time.Now().Add(90*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
		require.Equal(t, contract.StateSucceeded, p.State, task.ID)
		require.Equal(t, n, p.Sent, task.ID)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer lcancel()
	l, err := gateway.FetchLedger(lctx, st.gw.URL)
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond) // the watch's last values
	for _, task := range tasks {
		pw.requireMonotonic(t, task.ID)
	}
	require.Equal(t, parts*n, l.AcceptedKeys(), "every recipient accepted")
	require.Zero(t, l.Duplicates)
	for id, g := range gaps {
		require.Less(t, g, 3*time.Second, "progress of %s moves again within 3 s of the kill", id)
	}
	for id, g := range longest {
		require.Less(t, g, 3*time.Second, "progress of %s never pauses for 3 s after the kill", id)
	}
}

// foldLines are the lines of a status process's log about its fold
// leases and partitions.
func foldLines(logs string) string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "partition") || strings.Contains(line, "fold") || strings.HasPrefix(line, "=== proctest") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
