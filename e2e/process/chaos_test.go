package process

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestChaosKillDispatch runs every service as its own OS process and kills
// dispatch with SIGKILL again and again while a 3,000-recipient webhook task
// is sent through a gateway process that injects 5% 503s and 2% 429s. The
// gateway's ledger is the judge: no recipient may be lost, progress must
// agree with what the gateway accepted, and the only recipients allowed to be
// accepted twice are those whose send was in flight at a kill (at most the
// account's concurrency per kill).
//
// It is not parallel: the kill timing and the time budget assume the
// machine is not also running the in-process tests. It takes about 100 s,
// so it is opt-in: BROADCAST_CHAOS=1 (.ci/run runs it on its own).
func TestChaosKillDispatch(t *testing.T) {
	if os.Getenv("BROADCAST_CHAOS") == "" {
		t.Skip("long chaos test: set BROADCAST_CHAOS=1 to run it")
	}
	const (
		n           = 3000
		badEvery    = 100 // 1% of the recipients are rejected permanently
		concurrency = 8
		wantKills   = 4
	)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("chaos seed %d", seed)

	st := startStack(t, 5*time.Millisecond, 11,
		"-fail-rate", "0.05", "-rate-limited-rate", "0.02", "-retry-after", "1s", "-permanent-prefix", "bad-")
	others := st.startAll("ingest", "render", "status")
	dispatch := st.start("dispatch", "DISPATCH_BACKOFF_BASE=100ms", "DISPATCH_BACKOFF_MAX=1s")
	// The pinned rate (min_rate_per_sec): the gateway answers 2% of
	// requests 429 at random, whatever the rate, and adaptive pacing
	// answering each with a halving would bring the account down to ~15/s
	// (measured). Retry-After pauses still apply.
	st.c.putHook(st.gw.URL, 150, concurrency)
	dispatch.WaitLog("account started", 10*time.Second)

	task := contract.Task{ID: "chaos-kill-dispatch", Channel: "webhook", Template: "Hello {{.to}}", MaxAttempts: 10}
	var bad int
	task.Recipients, bad = pipelinetest.RecipientsWithRejects(n, badEvery, badEvery/2)
	st.c.submitTask(task)
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	final := func(p *contract.Progress) bool { return p.State.Final() }

	// Kill dispatch at a random moment 2-4 s after it (re)started sending, so
	// every kill hits a dispatch with sends in flight. The gateway's request
	// count tells when it sends again (progress also moves on events
	// published before a kill). recoveries[i] is how long dispatch took after
	// restart i+1 to send its first request: its start, the dead process's
	// lease taken at once (its alive subject has no responders), and up to
	// the lanes' ack wait (2 s) when every MaxAckPending slot is held by
	// jobs the dead process had taken; the per-second log shows both.
	requests := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, st.gw.URL)
		if err != nil {
			return -1
		}
		return l.Requests
	}
	var kills int
	var recoveries []time.Duration
	requestsAtKill := 0
	for kills < wantKills {
		restarted := time.Now()
		sending := false
		for !sending && time.Now().Before(deadline) {
			if sending = requests() > requestsAtKill; !sending {
				time.Sleep(200 * time.Millisecond)
			}
		}
		require.True(t, sending, "dispatch sent nothing after restart #%d; progress %+v", kills, st.c.progress(task.ID))
		if kills > 0 {
			recoveries = append(recoveries, time.Since(restarted).Round(10*time.Millisecond))
		}
		killAt := time.Now().Add(2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		p := st.c.pollProgress(task.ID, killAt, final)
		if final(p) {
			break
		}
		dispatch.Kill()
		kills++
		killedAt := time.Since(start)
		// Requests sent just before the kill may reach the gateway after it;
		// count them during the pause, so only the new process's requests
		// count as its recovery.
		time.Sleep(300 * time.Millisecond)
		requestsAtKill = requests()
		t.Logf("kill #%d at %s: gateway requests=%d, progress sent=%d retrying=%d failed=%d", kills,
			killedAt.Round(time.Millisecond), requestsAtKill, p.Sent, p.Retrying, p.Failed)
		dispatch.Restart()
	}

	last := st.c.pollProgress(task.ID, deadline, final)
	elapsed := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
	cancel()
	require.NoError(t, err)
	t.Logf("chaos figures: kills=%d duplicates=%d elapsed=%s requests=%d accepted=%d accepted_keys=%d injected=%v recoveries=%v",
		kills, l.Duplicates, elapsed.Round(time.Millisecond), l.Requests, l.Accepted, l.AcceptedKeys(), l.Injected, recoveries)
	t.Logf("gateway accepted per second: %v", l.AcceptedPerSecond["hook"])
	t.Logf("last progress: %+v", *last)
	require.True(t, final(last), "task not final after 3 minutes")

	require.Equal(t, wantKills, kills, "the task finished before dispatch was killed %d times", wantKills)
	for _, p := range others {
		require.True(t, p.Running(), "%s exited: %v", p.Name, p.ExitErr())
	}

	// Nothing lost: every good recipient was accepted at least once, under
	// its own Idempotency-Key and with its own text; every bad one was tried
	// and never accepted.
	var missing, wrong []string
	for i, r := range task.Recipients {
		key := contract.JobID(task.ID, i, false)
		switch {
		case strings.HasPrefix(r.To, "bad-"):
			if l.RequestsByKey[key] == 0 || l.AcceptedByKey[key] != 0 {
				wrong = append(wrong, fmt.Sprintf("%s: %d requests, %d accepted", r.To, l.RequestsByKey[key], l.AcceptedByKey[key]))
			}
		case l.AcceptedByKey[key] == 0:
			missing = append(missing, r.To)
		case l.Bodies[key] != "Hello "+r.To:
			wrong = append(wrong, fmt.Sprintf("%s: body %q", r.To, l.Bodies[key]))
		}
	}
	require.Empty(t, missing, "recipients the gateway never accepted")
	require.Empty(t, wrong)
	require.Equal(t, n-bad, l.AcceptedKeys(), "distinct recipients accepted")

	// Progress agrees with the gateway.
	require.Equal(t, contract.StatePartial, last.State)
	require.Equal(t, n, last.Total)
	require.Equal(t, l.AcceptedKeys(), last.Sent, "progress.sent vs keys the gateway accepted")
	require.Equal(t, bad, last.Failed)
	require.Zero(t, last.Retrying)
	require.Equal(t, last.Total, last.Done())

	// Only sends in flight at a kill may have been accepted (or, for a bad
	// recipient, rejected) twice.
	require.LessOrEqual(t, l.Duplicates, kills*concurrency, "recipients accepted more than once")
	require.GreaterOrEqual(t, l.Injected["400"], bad)
	require.LessOrEqual(t, l.Injected["400"], bad+kills*concurrency, "bad recipients tried more than once")
	require.Zero(t, l.BadRequest)
}
