package render

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestGroupJobs: each account's jobs, in batch order, in groups of at most
// the size and the byte bound, split evenly; a group of one is left out
// (its job goes alone).
func TestGroupJobs(t *testing.T) {
	t.Parallel()
	var jobs []renderedJob
	for i, acct := range strings.Split("aababaaab", "") { // a: 0 1 3 5 6 7; b: 2 4 8
		jobs = append(jobs, renderedJob{pos: i, account: acct, data: []byte("0123456789")})
	}
	g := groupJobs(jobs, 4, 1000)
	require.Equal(t, []contract.JobGroup{
		{Account: "a", Positions: []int{0, 1, 3}},
		{Account: "b", Positions: []int{2, 4, 8}},
		{Account: "a", Positions: []int{5, 6, 7}},
	}, g.Groups)
	// 11 bytes a job: at most two fit in 25; the last a job and b job are alone.
	g = groupJobs(jobs, 4, 25)
	require.Equal(t, []contract.JobGroup{
		{Account: "a", Positions: []int{0, 1}},
		{Account: "b", Positions: []int{2, 4}},
		{Account: "a", Positions: []int{3, 5}},
		{Account: "a", Positions: []int{6, 7}},
	}, g.Groups)
	require.Empty(t, groupJobs(jobs[:1], 4, 1000).Groups)
}

// TestGroupJobsSplitsEvenly: an account's share of a batch a little over
// the group size makes as few messages as the size allows, of even sizes,
// never a group of one left behind.
func TestGroupJobsSplitsEvenly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n, size int
		want    []int
	}{
		{17, 24, []int{17}},
		{24, 24, []int{24}},
		{25, 24, []int{13, 12}},
		{17, 16, []int{9, 8}},
		{50, 16, []int{13, 13, 12, 12}},
		{167, 24, []int{24, 24, 24, 24, 24, 24, 23}},
	} {
		var jobs []renderedJob
		for i := range tc.n {
			jobs = append(jobs, renderedJob{pos: i, account: "a", data: []byte("x")})
		}
		var sizes []int
		next := 0
		for _, grp := range groupJobs(jobs, tc.size, 1<<20).Groups {
			for _, p := range grp.Positions {
				require.Equal(t, next, p, "%d jobs at %d: positions in batch order", tc.n, tc.size)
				next++
			}
			sizes = append(sizes, len(grp.Positions))
		}
		require.Equal(t, tc.want, sizes, "%d jobs at %d a group", tc.n, tc.size)
	}
}

// TestBatchRenderedAgainKeepsItsGrouping: a batch rendered a second time
// (a resumed expansion) after an account joined, so that many recipients
// would now pick another account, publishes the groups it recorded the
// first time, to the same accounts under the same ids: the stream keeps
// each job once.
func TestBatchRenderedAgainKeepsItsGrouping(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const task, n = "regroup", 200
	accounts := putSandboxTask(ctx, t, js, task, "hi {{.name}}", "a", "b")

	svc := runService(t, js, Config{JobsPerMessage: 8})

	batch := contract.RenderBatch{TaskID: task, First: 100}
	for i := range n {
		batch.Recipients = append(batch.Recipients, contract.BatchRecipient{To: fmt.Sprintf("user-%d", i), Vars: map[string]any{"name": i}})
	}
	publishBatch := func(id string) {
		data, _ := json.Marshal(batch)
		_, err := js.Publish(ctx, contract.RenderSubject(task), data, jetstream.WithMsgID(id))
		require.NoError(t, err)
	}
	jobs, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	stored := func() uint64 {
		info, err := jobs.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs
	}
	publishBatch("first")
	// Counted once every job is stored: a count taken before could miss
	// groups still being published.
	require.Eventually(t, func() bool { return len(readJobs(t, js)) == n }, 10*time.Second, 50*time.Millisecond)
	first := stored()
	require.Less(t, first, uint64(n/4), "jobs travel in groups")

	_, err = accounts.Put(ctx, "c", []byte(`{"channel":"sandbox"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return svc.accounts.Get("c") != nil }, 5*time.Second, 10*time.Millisecond)
	batch.Resumed = true
	publishBatch("again")
	cons, err := js.Consumer(ctx, contract.StreamRender, contract.ConsumerRender)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.Delivered.Stream >= 2 && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 50*time.Millisecond, "the batch rendered again")
	require.Equal(t, first, stored(), "no message added")
	got := readJobs(t, js)
	require.Len(t, got, n, "each job once")
	for _, j := range got {
		require.NotEqual(t, "c", j.Account, "job %s stays where it was grouped", j.ID)
	}
}

// TestRenderAnnouncesAccountsAhead: before it stores a batch's jobs,
// render names their accounts on the wake subject, each once, in one
// notice that a subscriber of both subjects sees before the first job.
func TestRenderAnnouncesAccountsAhead(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const task, n = "announced", 90
	accounts := putSandboxTask(ctx, t, js, task, "hi", "a", "b", "c")
	_, err := accounts.Put(ctx, "other", []byte(`{"channel":"smtp","smtp":{"host":"127.0.0.1"}}`))
	require.NoError(t, err)

	// One subscription keeps the server's order of the two subjects.
	seen := make(chan *nats.Msg, 1000)
	sub, err := js.Conn().ChanSubscribe("broadcast.>", seen)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	runService(t, js, Config{JobsPerMessage: 8})

	batch := contract.RenderBatch{TaskID: task}
	for i := range n {
		batch.Recipients = append(batch.Recipients, contract.BatchRecipient{To: fmt.Sprintf("user-%d", i)})
	}
	data, _ := json.Marshal(batch)
	_, err = js.Publish(ctx, contract.RenderSubject(task), data)
	require.NoError(t, err)

	var notices [][]string
	for {
		select {
		case m := <-seen:
			switch {
			case m.Subject == contract.SubjectWake:
				var names []string
				contract.WakeNoticeAccounts(m.Data, func(a string) { names = append(names, a) })
				notices = append(notices, names)
			case strings.HasPrefix(m.Subject, contract.SubjectJobsPrefix):
				require.Len(t, notices, 1, "one notice, before the first job")
				require.ElementsMatch(t, []string{"a", "b", "c"}, notices[0], "the batch's accounts, each once")
				return
			}
		case <-ctx.Done():
			t.Fatal("no job stored")
		}
	}
}

// putSandboxTask puts sandbox accounts and the record of a sandbox task
// with template tmpl, returning the accounts bucket.
func putSandboxTask(ctx context.Context, t *testing.T, js jetstream.JetStream, task, tmpl string, accounts ...string) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	for _, name := range accounts {
		_, err = kv.Put(ctx, name, []byte(`{"channel":"sandbox"}`))
		require.NoError(t, err)
	}
	tasks, err := js.KeyValue(ctx, contract.BucketTasks)
	require.NoError(t, err)
	rec, _ := json.Marshal(contract.TaskRecord{Task: contract.Task{ID: task, Channel: "sandbox", Template: tmpl, MaxAttempts: 3, Priority: contract.PriorityNormal}})
	_, err = tasks.Put(ctx, task, rec)
	require.NoError(t, err)
	return kv
}

// readJobs decodes every job queued in JOBS.
func readJobs(t *testing.T, js jetstream.JetStream) map[string]contract.Job {
	t.Helper()
	out := map[string]contract.Job{}
	for _, m := range natstest.StoredMsgs(t, js, contract.StreamJobs) {
		for _, part := range contract.SplitJobs(m.Data) {
			var j contract.Job
			require.NoError(t, contract.DecodeJob(part, &j))
			_, dup := out[j.ID]
			require.False(t, dup, "job %s queued twice", j.ID)
			out[j.ID] = j
		}
	}
	return out
}
