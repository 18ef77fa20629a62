package dispatch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// TestDispatchReplicasShareAccounts: one replica takes all six accounts
// of a running broadcast; when a second one joins, the first hands half of
// them over, so each sends for three, and the broadcast goes through both,
// each recipient once. (An account holds its lease only while it has
// work, so the broadcast, 20 s at the accounts' rates, runs throughout.)
func TestDispatchReplicasShareAccounts(t *testing.T) {
	t.Parallel()
	const accounts, n = 6, 1200
	e := harness.NewDispatchEnv(t, dispatch.Config{MaxInFlight: 4})
	var pool []string
	for i := range accounts {
		name := fmt.Sprintf("share-%d", i)
		pool = append(pool, name)
		e.TS.PutAccount(t, name, `{"channel":"sandbox","rate_per_sec":10,"burst":1,"concurrency":8,"latency":"10ms"}`)
	}
	e.StartReplica()
	task := contract.Task{ID: "share", Channel: "sandbox", Template: "hi {{.to}}", Accounts: pool, Recipients: pipelinetest.Recipients("s", n)}
	harness.Submit(t, e.TS, task)
	waitShares(t, e.TS, pool, []int{6}, 15*time.Second)
	e.StartReplica()
	start := time.Now()
	owners := waitShares(t, e.TS, pool, []int{3, 3}, 15*time.Second)
	t.Logf("after the second replica joined, accounts per replica %v within %s", owners, time.Since(start).Round(time.Millisecond))

	p := e.TS.WaitFinal(t, task.ID, 60*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	log := e.SendLog()
	byTo := map[string]int{}
	for _, s := range log {
		byTo[s.To]++
	}
	require.Len(t, byTo, n, "every recipient reached the provider")
	for to, c := range byTo {
		require.Equal(t, 1, c, "recipient %s sent once", to)
	}
	perAccount := map[string]int{}
	for _, ev := range harness.EventsOf(e.TS.Events(t, task.ID), contract.EventSent) {
		perAccount[ev.Account]++
	}
	by := e.SendsBy()
	t.Logf("sends per replica: %v; per account %v", by, perAccount)
	require.Len(t, by, 2, "both replicas sent")
	for r, c := range by {
		require.Greater(t, c, n/5, "replica %d sent its share", r)
	}
}

// waitShares waits until the accounts' leases are held by as many replicas
// as want has entries, holding want[i] accounts each (in any order), and
// returns the counts.
func waitShares(t *testing.T, ts *pipelinetest.Server, accounts []string, want []int, timeout time.Duration) []int {
	t.Helper()
	var got []int
	natstest.Eventually(t, timeout, func() bool {
		got = leaseShares(t, ts, accounts)
		if len(got) != len(want) {
			return false
		}
		for i := range want {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	}, fmt.Sprintf("accounts per replica %v", want))
	return got
}

// leaseShares counts the accounts per replica from the leases, sorted from
// most to fewest. A lease's value is "<replica>/<runner>".
func leaseShares(t *testing.T, ts *pipelinetest.Server, accounts []string) []int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	per := map[string]int{}
	for _, a := range accounts {
		e, err := kv.Get(ctx, a)
		if err != nil {
			continue
		}
		v := string(e.Value())
		per[v[:max(strings.LastIndex(v, "/"), 0)]]++
	}
	var out []int
	for _, c := range per {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b int) int { return b - a })
	return out
}
