package process

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestChaosKillStatus kills the status service with SIGKILL again and again
// while a broadcast runs, each time at a random moment (events folded but
// not yet flushed are lost with the process and redelivered), and checks
// the final progress equals what the gateway received, exactly, and that no
// count ever went backwards between restarts.
func TestChaosKillStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process chaos test")
	}
	const (
		n         = 3000
		badEvery  = 100
		wantKills = 5
	)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("chaos seed %d", seed)

	st := startStack(t, 2*time.Millisecond, 5, "-fail-rate", "0.05", "-permanent-prefix", "bad-")
	for _, name := range []string{"ingest", "render", "dispatch"} {
		st.start(name, "DISPATCH_BACKOFF_BASE=100ms", "DISPATCH_BACKOFF_MAX=1s")
	}
	status := st.start("status", "STATUS_FLUSH_INTERVAL=500ms")
	st.c.putHook(st.gw.URL, 150, 8)

	task := contract.Task{ID: "chaos-kill-status", Channel: "webhook", Template: "Hello {{.to}}", MaxAttempts: 10}
	var bad int
	task.Recipients, bad = pipelinetest.RecipientsWithRejects(n, badEvery, 7)
	st.c.submitTask(task)
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	final := func(p *contract.Progress) bool { return p.State.Final() }

	kills := 0
	var last contract.Progress
	for kills < wantKills {
		killAt := time.Now().Add(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		p := st.c.pollProgress(task.ID, killAt, final)
		if p != nil && final(p) {
			break
		}
		status.Kill()
		kills++
		if p != nil {
			require.GreaterOrEqual(t, p.Sent, last.Sent, "sent went backwards")
			require.GreaterOrEqual(t, p.Failed, last.Failed, "failed went backwards")
			last = *p
			t.Logf("kill #%d at %s: progress sent=%d failed=%d retrying=%d", kills, time.Since(start).Round(time.Millisecond), p.Sent, p.Failed, p.Retrying)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(time.Second))))
		status.Restart()
	}
	got := st.c.pollProgress(task.ID, deadline, final)
	require.NotNil(t, got)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
	cancel()
	require.NoError(t, err)
	t.Logf("status chaos figures: kills=%d elapsed=%s sent=%d failed=%d accepted_keys=%d duplicates=%d",
		kills, time.Since(start).Round(time.Millisecond), got.Sent, got.Failed, l.AcceptedKeys(), l.Duplicates)

	require.True(t, final(got), "task not final: %+v", *got)
	require.GreaterOrEqual(t, kills, 3, "status was killed during the broadcast")
	require.Equal(t, contract.StatePartial, got.State)
	require.Equal(t, n, got.Total)
	require.Equal(t, l.AcceptedKeys(), got.Sent, "progress.sent equals what the gateway accepted")
	require.Equal(t, n-bad, got.Sent)
	require.Equal(t, bad, got.Failed)
	require.Zero(t, got.Retrying)
	require.Equal(t, got.Total, got.Done())
	require.Zero(t, l.Duplicates, "killing status never causes a second send")
}
