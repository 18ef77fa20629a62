package dispatch

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// unauthorized answers 401 to everything, like a provider whose token was
// revoked.
var unauthorized = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, `{"error":"invalid token"}`, http.StatusUnauthorized)
})

// queueDrained watches an account's consumer from now on and returns a
// function reporting when its queue first became empty (no pending and no
// unacknowledged jobs) after it had held work.
func queueDrained(t *testing.T, ts *pipelinetest.Server, account string) func() time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var drainedAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		busy := false
		for ctx.Err() == nil {
			c, err := ts.JS.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, contract.PriorityNormal))
			if err == nil {
				if info, err := c.Info(ctx); err == nil {
					n := info.NumPending + uint64(info.NumAckPending)
					if n > 0 {
						busy = true
					} else if busy {
						mu.Lock()
						drainedAt = time.Now()
						mu.Unlock()
						return
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return drainedAt
	}
}

// TestDispatchPoolFailover: hook-a answers 401 to everything, hook-b is
// healthy. After three auth failures in a row hook-a is paused and its
// queued jobs move to hook-b; the jobs that got a 401 before the pause move
// too: no recipient fails because of an account's problem, nothing is lost
// or sent twice.
func TestDispatchPoolFailover(t *testing.T) {
	t.Parallel()
	const n, concurrency = 200, 4
	ts := pipelinetest.Start(t)
	bad := harness.StartRecorder(t, unauthorized, 0)
	gw, good := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	ts.PutAccount(t, "hook-a", harness.WebhookAccount(bad.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	ts.PutAccount(t, "hook-b", harness.WebhookAccount(good.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{BackoffBase: 50 * time.Millisecond}})
	drainedA := queueDrained(t, ts, "hook-a")

	task := contract.Task{ID: "pool", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"hook-a", "hook-b"}, Recipients: pipelinetest.Recipients("u", n)}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 30*time.Second)

	h := harness.AccountHealth(t, ts, "hook-a")
	require.NotNil(t, h, "hook-a has a health value")
	l := gw.Ledger()
	acc := good.Accepted()
	lastSend := acc[len(acc)-1].At
	dead := harness.DeadLetters(t, ts, task.ID)
	moved := 0
	for _, hit := range acc {
		if hit.Account == "hook-b" {
			moved++
		}
	}
	t.Logf("pool: hook-a got %d requests (all 401) and was paused (%q); progress sent %d failed %d; hook-b accepted %d (%d keys, %d duplicates); dead letters %d",
		len(bad.All()), h.Reason, p.Sent, p.Failed, l.Accepted, l.AcceptedKeys(), l.Duplicates, len(dead))
	t.Logf("time to move work off the failed account: pause -> hook-a's queue empty %s, pause -> last send at hook-b %s",
		drainedA().Sub(h.Since).Round(time.Millisecond), lastSend.Sub(h.Since).Round(time.Millisecond))

	require.Equal(t, contract.HealthPaused, h.State)
	require.Contains(t, h.Reason, "3 auth failures in a row")
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent, "every recipient sent, the ones hook-a refused included")
	require.Zero(t, p.Failed, "an account's 401 never fails a recipient")
	require.Empty(t, dead)
	require.LessOrEqual(t, len(bad.All()), 3+concurrency, "hook-a got only the requests before its pause")
	require.Equal(t, n, l.Accepted)
	require.Equal(t, n, l.AcceptedKeys())
	require.Zero(t, l.Duplicates)
	require.False(t, drainedA().IsZero(), "hook-a's queue emptied")
}

// TestDispatchPoolDisable: disabling an account (enabled:false) mid-run
// moves its queued jobs to the other account of the pool.
func TestDispatchPoolDisable(t *testing.T) {
	t.Parallel()
	const n = 200
	ts := pipelinetest.Start(t)
	gwC, recC := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	gwD, recD := harness.StartRecordedGateway(t, gateway.Config{Seed: 2}, 0)
	ts.PutAccount(t, "hook-c", harness.WebhookAccount(recC.URL, `"rate_per_sec":40,"burst":5,"concurrency":4`))
	ts.PutAccount(t, "hook-d", harness.WebhookAccount(recD.URL, `"rate_per_sec":40,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	drainedC := queueDrained(t, ts, "hook-c")

	task := contract.Task{ID: "disable", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"hook-c", "hook-d"}, Recipients: pipelinetest.Recipients("d", n)}
	harness.Submit(t, ts, task)
	harness.WaitCount(t, 15*time.Second, 20, func() int { return len(recC.Accepted()) }, "hook-c sends before it is disabled")
	disabledAt := time.Now()
	ts.PutAccount(t, "hook-c", harness.WebhookAccount(recC.URL, `"rate_per_sec":40,"burst":5,"concurrency":4,"enabled":false`))
	p := ts.WaitFinal(t, task.ID, 30*time.Second)

	lc, ld := gwC.Ledger(), gwD.Ledger()
	cHits := recC.All()
	lastC := cHits[len(cHits)-1].At
	both := 0
	for key := range lc.AcceptedByKey {
		if ld.AcceptedByKey[key] > 0 {
			both++
		}
	}
	t.Logf("disable: hook-c sent %d (last request %s after the disable), hook-d sent %d; hook-c's queue empty %s after the disable; progress sent %d; keys at both %d",
		lc.Accepted, lastC.Sub(disabledAt).Round(time.Millisecond), ld.Accepted, drainedC().Sub(disabledAt).Round(time.Millisecond), p.Sent, both)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, lc.AcceptedKeys()+ld.AcceptedKeys(), "every recipient accepted by one of the two")
	require.Zero(t, both, "no recipient accepted by both")
	require.Zero(t, lc.Duplicates+ld.Duplicates)
	require.Less(t, lastC.Sub(disabledAt), time.Second, "a disabled account stops sending at once (only sends in flight finish)")
	require.Less(t, lc.Accepted, n/2, "hook-c's remaining share moved to hook-d")
	require.False(t, drainedC().IsZero(), "hook-c's queue emptied")
}

// TestDispatchPoolNoHealthyAccount: when every account of the task is
// paused, its jobs wait with retrying events saying why, those that got a
// 401 included; no recipient fails and the task does not end.
func TestDispatchPoolNoHealthyAccount(t *testing.T) {
	t.Parallel()
	const n, concurrency = 50, 4
	ts := pipelinetest.Start(t)
	bad := harness.StartRecorder(t, unauthorized, 0)
	ts.PutAccount(t, "hook-e", harness.WebhookAccount(bad.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	ts.PutAccount(t, "hook-f", harness.WebhookAccount(bad.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	task := contract.Task{ID: "nohealthy", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"hook-e", "hook-f"}, Recipients: pipelinetest.Recipients("h", n)}
	harness.Submit(t, ts, task)

	waiting := func() map[string]contract.Event {
		out := map[string]contract.Event{}
		for _, e := range harness.EventsOf(ts.Events(t, task.ID), contract.EventRetrying) {
			if e.Code == "no_healthy_account" {
				out[e.JobID] = e
			}
		}
		return out
	}
	p := ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Retrying == n && len(waiting()) == n
	}, "every recipient waiting for a healthy account")
	w := waiting()
	var sample contract.Event
	for _, e := range w {
		sample = e
		break
	}
	he, hf := harness.WaitAccountHealth(t, ts, "hook-e", nil), harness.WaitAccountHealth(t, ts, "hook-f", nil)
	t.Logf("no healthy account: %d requests (all 401), progress failed %d retrying %d state %s error %q; %d jobs waiting, e.g. %q",
		len(bad.All()), p.Failed, p.Retrying, p.State, p.Error, len(w), sample.Error)
	require.Equal(t, contract.HealthPaused, he.State)
	require.Equal(t, contract.HealthPaused, hf.State)
	require.Zero(t, p.Failed, "an account's 401 never fails a recipient")
	require.Empty(t, harness.DeadLetters(t, ts, task.ID))
	require.LessOrEqual(t, len(bad.All()), 2*(3+concurrency), "only the requests before the pauses")
	require.False(t, p.State.Final(), "the task waits, it does not fail")
	require.Contains(t, p.Error, "no healthy webhook account", "progress says why it waits")
	require.True(t, strings.Contains(sample.Error, "no healthy webhook account"), sample.Error)
	require.Equal(t, contract.ClassAccountFatal, sample.Class)
}

// TestDeletedAccountIsReaped: an account deleted mid-task has its queued
// jobs moved to the other account of the pool; once nothing of it is left
// its runner stops and its lane consumers are deleted (they stayed, with
// the runner's goroutines, for as long as the process ran).
func TestDeletedAccountIsReaped(t *testing.T) {
	t.Parallel()
	const n = 150
	ts := pipelinetest.Start(t)
	gwA, recA := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	gwB, recB := harness.StartRecordedGateway(t, gateway.Config{Seed: 2}, 0)
	ts.PutAccount(t, "rp-a", harness.WebhookAccount(recA.URL, `"rate_per_sec":60,"burst":5,"concurrency":4`))
	ts.PutAccount(t, "rp-b", harness.WebhookAccount(recB.URL, `"rate_per_sec":30,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{ReapInterval: 300 * time.Millisecond}})
	task := contract.Task{ID: "reap", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"rp-a", "rp-b"}, Recipients: pipelinetest.Recipients("r", n)}
	harness.Submit(t, ts, task)
	harness.WaitCount(t, 15*time.Second, 10, func() int { return len(recB.Accepted()) }, "rp-b sends before it is deleted")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "rp-b"))
	p := ts.WaitFinal(t, task.ID, 30*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, gwA.Ledger().AcceptedKeys()+gwB.Ledger().AcceptedKeys())
	require.Zero(t, gwA.Ledger().Duplicates+gwB.Ledger().Duplicates)

	natstest.Eventually(t, 10*time.Second, func() bool {
		for _, pr := range contract.Priorities {
			if _, err := ts.JS.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer("rp-b", pr)); err == nil {
				return false
			}
		}
		return true
	}, "the deleted account's consumers are gone")
	// Its high and low lanes have consumers only while they hold jobs.
	_, err = ts.JS.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer("rp-a", contract.PriorityNormal))
	require.NoError(t, err, "the live account keeps its normal lane")
	t.Logf("deleted account: rp-a sent %d, rp-b %d; rp-b's runner and consumers removed after the task", gwA.Ledger().AcceptedKeys(), gwB.Ledger().AcceptedKeys())
}

// TestDispatchPoolOfManyAccounts: a task naming more accounts than a job
// carries (contract.MaxJobPool) has its jobs refer to the task's list;
// when one named account answers 401 its jobs still move only to the
// other named accounts, never to an account the task did not name.
func TestDispatchPoolOfManyAccounts(t *testing.T) {
	t.Parallel()
	const n, named = 300, contract.MaxJobPool + 4
	ts := pipelinetest.Start(t)
	bad := harness.StartRecorder(t, unauthorized, 0)
	gw, good := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	_, outside := harness.StartRecordedGateway(t, gateway.Config{Seed: 2}, 0)
	var pool []string
	for i := range named {
		name, url := fmt.Sprintf("many-%02d", i), good.URL
		if i == 0 {
			url = bad.URL
		}
		ts.PutAccount(t, name, harness.WebhookAccount(url, `"rate_per_sec":200,"burst":5,"concurrency":2`))
		pool = append(pool, name)
	}
	// Far more capacity than the others: a move that could reach it would
	// (PickAccount weighs by capacity).
	ts.PutAccount(t, "outside", harness.WebhookAccount(outside.URL, `"rate_per_sec":100000,"burst":5,"concurrency":2`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{BackoffBase: 50 * time.Millisecond}})

	task := contract.Task{ID: "manypool", Channel: "webhook", Template: "hi {{.to}}", Accounts: pool, Recipients: pipelinetest.Recipients("m", n)}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 30*time.Second)
	l := gw.Ledger()
	t.Logf("%d named accounts: many-00 got %d requests (all 401); sent %d failed %d; the others accepted %d (%d duplicates); the account not named got %d",
		named, len(bad.All()), p.Sent, p.Failed, l.AcceptedKeys(), l.Duplicates, len(outside.All()))
	require.NotEmpty(t, bad.All(), "many-00 got its share first")
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys())
	require.Zero(t, l.Duplicates)
	require.Empty(t, outside.All(), "no job moved beyond the task's accounts")
}
