package process

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/proctest"
)

// TestKillDispatchReplicaResumesSoon runs two dispatch processes beside
// ingest, render and status processes, and kills (SIGKILL) the one that
// holds the account's lease while it sends, twice (the killed one comes
// back as the standby). The other must be sending again within 3 s of each
// kill: it takes the lease as soon as the server has closed the dead
// process's connection (lease.Presence), and the jobs the dead process held
// come back after the short ack wait. The gateway's ledger judges the rest:
// every recipient accepted, repeated only for sends in flight at a kill.
func TestKillDispatchReplicaResumesSoon(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process kill test")
	}
	const (
		n           = 2000
		rate        = 200
		concurrency = 8
		kills       = 2
	)
	st := startStack(t, 5*time.Millisecond, 3)
	st.startAll("ingest", "render", "status")
	replicas := st.replicas(2, "dispatch")
	st.c.putHook(st.gw.URL, rate, concurrency)
	task := contract.Task{ID: "kill-replica", Channel: "webhook", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("k", n)}
	st.c.submitTask(task)

	requests := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, st.gw.URL)
		require.NoError(t, err)
		return l.Requests
	}
	var gaps []time.Duration
	for k := range kills {
		// Sending, with the holder known.
		want := (k + 1) * n / (kills + 2)
		natstest.Eventually(t, 60*time.Second, func() bool { return requests() >= want }, "sends before kill %d", k+1)
		holder := leaseHolder(t, st.c, "hook", replicas)
		killedAt := time.Now()
		holder.Kill()
		// Requests sent just before the kill may still reach the gateway;
		// after 100 ms the count is the dead process's last.
		time.Sleep(100 * time.Millisecond)
		atKill := requests()
		for requests() <= atKill {
			require.Less(t, time.Since(killedAt), 30*time.Second, "sending never resumed after kill %d", k+1)
			time.Sleep(20 * time.Millisecond)
		}
		gap := time.Since(killedAt)
		gaps = append(gaps, gap)
		t.Logf("kill %d of the lease holder (pid %d) after %d requests: sending again after %s", k+1, holder.Pid(), atKill, gap.Round(10*time.Millisecond))
		holder.Restart()
	}

	p := st.c.pollProgress(task.ID, time.Now().Add(90*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
	cancel()
	require.NoError(t, err)
	t.Logf("recovery gaps %v; requests %d, accepted keys %d, duplicates %d; progress %s sent=%d failed=%d",
		gaps, l.Requests, l.AcceptedKeys(), l.Duplicates, p.State, p.Sent, p.Failed)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys(), "every recipient accepted")
	require.LessOrEqual(t, l.Duplicates, kills*concurrency, "repeats only for sends in flight at a kill")
	for i, g := range gaps {
		require.Less(t, g, 3*time.Second, "sending resumes within 3 s of kill %d", i+1)
	}
}

// leaseHolder returns the process among procs whose pid the account's lease
// names (owner ids are host/pid/random/seq).
func leaseHolder(t *testing.T, c *chaosClient, account string, procs []*proctest.Proc) *proctest.Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	e, err := kv.Get(ctx, account)
	require.NoError(t, err, "the account has a lease")
	pid, ok := ownerPid(string(e.Value()))
	require.True(t, ok, "owner id %q", e.Value())
	for _, p := range procs {
		if p.Pid() == pid {
			return p
		}
	}
	t.Fatalf("no process has pid %d (lease %q)", pid, e.Value())
	return nil
}

// ownerPid is the pid in a lease's owner id (host/pid/random/seq).
func ownerPid(owner string) (int, bool) {
	parts := strings.Split(owner, "/")
	if len(parts) != 4 {
		return 0, false
	}
	pid, err := strconv.Atoi(parts[1])
	return pid, err == nil
}
