package scenarios

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/scenario"
	"github.com/broadcastd/broadcast/internal/tape"
)

// TestScenarioTapeReplay records a run against a faulty gateway, tapes it
// from its events and dead letters (what `broadcast tape` writes), and
// plays the tape against a fresh stack whose gateway injects nothing else:
// every recipient must get the same answers, attempt by attempt, and the
// task must end with the same counts.
func TestScenarioTapeReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the scenario tester")
	}
	// Beside the seeds of TestScenarios, not after them.
	t.Parallel()
	sc := &scenario.Scenario{Seed: 4242,
		Pools: []scenario.Pool{{Channel: "webhook", Accounts: []scenario.Account{{
			Name: "hook-a", RatePerSec: 80, MinRatePerSec: 80, Burst: 4, Concurrency: 4, Timeout: 400 * time.Millisecond,
			Faults: scenario.Faults{FailRate: 0.12, RateLimitedRate: 0.05, TimeoutRate: 0.03, Latency: 3 * time.Millisecond},
		}}}},
		Tasks: []scenario.Task{{ID: "tape-1", Channel: "webhook", Recipients: seq(60), Bad: []int{70, 71, 72}, MaxAttempts: 6}},
	}
	ctx := context.Background()
	rec := scenario.RunAndCheck(ctx, sc, scenario.RunOptions{Logf: t.Logf})
	require.NoError(t, rec.Err)
	require.Empty(t, rec.Failures, rec.Summary())

	tp := tape.Build("tape-1", rec.Obs.Events["tape-1"], rec.Obs.Dead["tape-1"])
	statuses := map[int]int{}
	for _, a := range tp.Answers {
		statuses[a.Status]++
	}
	t.Logf("tape: %d answers, by status %v", len(tp.Answers), statuses)
	for _, st := range []int{200, 400, 503} {
		require.NotZero(t, statuses[st], "the recorded run has %d answers", st)
	}
	play := sc.Clone()
	play.Pools[0].Accounts[0].Faults = scenario.Faults{}
	rep := scenario.RunAndCheck(ctx, play, scenario.RunOptions{Logf: t.Logf, Tapes: map[string]*gateway.Tape{"hook-a": tp}})
	require.NoError(t, rep.Err)
	require.Empty(t, rep.Failures, rep.Summary())

	a, b := rec.Obs.Progress["tape-1"], rep.Obs.Progress["tape-1"]
	require.Equal(t, [5]int{a.Sent, a.Failed, a.Skipped, a.Expired, a.Cancelled}, [5]int{b.Sent, b.Failed, b.Skipped, b.Expired, b.Cancelled}, "outcome counts")
	require.Equal(t, answersByKey(rec.Obs.Hits["hook-a"]), answersByKey(rep.Obs.Hits["hook-a"]), "every key got the same answers, attempt by attempt")
}

// answersByKey is each key's answers in attempt order, as "attempt:status".
func answersByKey(hs []scenario.Hit) map[string]string {
	out := map[string]string{}
	for _, h := range hs {
		out[h.Key] += fmt.Sprintf("%d:%d ", h.Attempt, h.Status)
	}
	return out
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
