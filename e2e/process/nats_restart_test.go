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

// TestKillNATSMidTaskRepeatsNothing kills nats-server (SIGKILL) twice while
// a task is sent, restarting it on the same store. The dispatch lanes'
// consumers keep their state in memory, so each restart loses them and
// dispatch creates them again: the jobs still queued come back, and each is
// checked for an earlier send before it is sent. The gateway's ledger
// judges: every recipient accepted, repeated only for sends in flight at a
// kill, and the final progress equal to it.
func TestKillNATSMidTaskRepeatsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process nats restart test")
	}
	const (
		n           = 2000
		rate        = 200
		concurrency = 8
		kills       = 2
	)
	ns := proctest.StartNATS(t, t.TempDir(), 0)
	gw := proctest.StartGateway(t, "-latency", "5ms", "-seed", "4")
	c := newChaosClient(t, ns.URL)
	natsEnv := "NATS_URL=" + ns.URL
	var procs []*proctest.Proc
	for _, name := range []string{"ingest", "render", "dispatch", "status"} {
		procs = append(procs, startService(t, name, natsEnv))
	}
	c.putHook(gw.URL, rate, concurrency)
	task := contract.Task{ID: "nats-restart", Channel: "webhook", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("r", n)}
	c.submitTask(task)

	requests := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, gw.URL)
		require.NoError(t, err)
		return l.Requests
	}
	for k := range kills {
		want := (k + 1) * n / (kills + 2)
		require.Eventually(t, func() bool { return requests() >= want }, 90*time.Second, 20*time.Millisecond, "sends before kill %d", k+1)
		ns.Kill()
		atKill := requests()
		killedAt := time.Now()
		ns.Restart()
		require.Eventually(t, func() bool { return requests() > atKill+concurrency }, 60*time.Second, 20*time.Millisecond, "sending after restart %d", k+1)
		t.Logf("nats-server killed after %d requests and restarted: sending again after %s", atKill, time.Since(killedAt).Round(10*time.Millisecond))
	}
	p := c.pollProgress(task.ID, time.Now().Add(2*time.Minute), func(p *contract.Progress) bool { return p.State.Final() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(ctx, gw.URL)
	cancel()
	require.NoError(t, err)
	t.Logf("requests %d, accepted keys %d, duplicates %d; progress %s sent=%d failed=%d", l.Requests, l.AcceptedKeys(), l.Duplicates, p.State, p.Sent, p.Failed)
	for _, p := range procs {
		require.True(t, p.Running(), "%s exited: %v", p.Name, p.ExitErr())
	}
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys(), "every recipient accepted")
	require.LessOrEqual(t, l.Duplicates, kills*concurrency, "repeats only for sends in flight at a kill")
}
