package process

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/proctest"
)

// TestKillStatusReplicaKeepsProgressExact runs two status processes beside
// ingest, render and dispatch processes and kills (SIGKILL) the one that
// folds, twice, while a task is sent (the killed one comes back as the
// standby). Every progress value written must be monotonic (sent and
// failed never go back), progress must move again within 3 s of each kill,
// and the final progress must equal the gateway's ledger exactly.
func TestKillStatusReplicaKeepsProgressExact(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process status replica test")
	}
	const (
		n     = 2000
		rate  = 200
		kills = 2
	)
	st := startStack(t, 2*time.Millisecond, 9)
	st.startAll("ingest", "render", "dispatch")
	replicas := st.replicas(2, "status", "STATUS_FLUSH_INTERVAL=250ms")
	st.c.putHook(st.gw.URL, rate, 8)

	task := contract.Task{ID: "status-replicas", Channel: "webhook", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("s", n)}

	pw := watchProgress(t, st.c)
	lastSent := func() int {
		v, _ := pw.last(task.ID)
		return v.p.Sent
	}

	st.c.submitTask(task)

	var gaps []time.Duration
	for k := range kills {
		want := (k + 1) * n / (kills + 2)
		require.Eventually(t, func() bool { return lastSent() >= want }, 60*time.Second, 20*time.Millisecond, "progress before kill %d", k+1)
		holder := foldHolder(t, st.c, replicas)
		atKill := lastSent()
		killedAt := time.Now()
		holder.Kill()
		for !pw.movedSince(task.ID, killedAt, atKill) {
			require.Less(t, time.Since(killedAt), 30*time.Second, "progress never moved after kill %d", k+1)
			time.Sleep(20 * time.Millisecond)
		}
		gap := time.Since(killedAt)
		gaps = append(gaps, gap)
		t.Logf("kill %d of the folding status (pid %d) at sent=%d: progress moving again after %s", k+1, holder.Pid(), atKill, gap.Round(10*time.Millisecond))
		holder.Restart()
	}

	p := st.c.pollProgress(task.ID, time.Now().Add(90*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(lctx, st.gw.URL)
	lcancel()
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond) // the watch's last values
	t.Logf("progress gaps %v; %d progress values; final %s sent=%d failed=%d; gateway accepted keys %d, duplicates %d",
		gaps, pw.count(task.ID), p.State, p.Sent, p.Failed, l.AcceptedKeys(), l.Duplicates)
	pw.requireMonotonic(t, task.ID)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys(), "every recipient accepted")
	require.Zero(t, l.Duplicates)
	for i, g := range gaps {
		require.Less(t, g, 3*time.Second, "progress moves again within 3 s of kill %d", i+1)
	}
}

// foldHolder returns the status process among procs whose pid the fold
// lease names.
func foldHolder(t *testing.T, c *chaosClient, procs []*proctest.Proc) *proctest.Proc {
	t.Helper()
	return leaseHolder(t, c, contract.StatusFoldLease, procs)
}
