package process

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
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
	st := startStack(t, 5*time.Millisecond, 4)
	procs := st.startAll("ingest", "render", "dispatch", "status")
	st.c.putHook(st.gw.URL, rate, concurrency)
	task := contract.Task{ID: "nats-restart", Channel: "webhook", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("r", n)}
	st.c.submitTask(task)

	requests := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, st.gw.URL)
		require.NoError(t, err)
		return l.Requests
	}
	for k := range kills {
		want := (k + 1) * n / (kills + 2)
		require.Eventually(t, func() bool { return requests() >= want }, 90*time.Second, 20*time.Millisecond, "sends before kill %d", k+1)
		st.ns.Kill()
		atKill := requests()
		killedAt := time.Now()
		st.ns.Restart()
		require.Eventually(t, func() bool { return requests() > atKill+concurrency }, 60*time.Second, 20*time.Millisecond, "sending after restart %d", k+1)
		t.Logf("nats-server killed after %d requests and restarted: sending again after %s", atKill, time.Since(killedAt).Round(10*time.Millisecond))
	}
	p := st.c.pollProgress(task.ID, time.Now().Add(2*time.Minute), func(p *contract.Progress) bool { return p.State.Final() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
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
