package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/broadcastd/broadcast/internal/scenario"
)

// Flags of the scenario tester (TestScenarios). The default run is the
// fixed seeds plus scenario.fresh fresh ones, in process.
var (
	scenarioSeed     = flag.Uint64("scenario.seed", 0, "run only this seed (replay)")
	scenarioN        = flag.Int("scenario.n", 0, "run this many fresh seeds instead of the fixed set (long mode)")
	scenarioDuration = flag.Duration("scenario.duration", 0, "keep drawing fresh seeds for this long (long mode)")
	scenarioFresh    = flag.Int("scenario.fresh", 2, "fresh seeds added to the fixed set in the default run")
	scenarioMulti    = flag.Bool("scenario.multiprocess", false, "run every service as its own process, with kill -9 and nats-server restarts")
	scenarioKnown    = flag.Bool("scenario.known", false, "fail on the known causes too (switch on once their fixes are merged)")
	scenarioShrink   = flag.Duration("scenario.shrink", 2*time.Minute, "time allowed to shrink a failing scenario (0: no shrinking)")
)

// fixedSeeds run on every go test ./e2e: small scenarios covering every
// channel with a fake, faults, operator actions and caps. A seed that
// found a bug stays here once the bug is fixed.
var fixedSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

// TestScenarios is the randomized scenario tester (issue 12): each seed
// draws accounts, tasks, faults and operator actions, runs them against the
// whole pipeline and checks the fakes' ledgers and KV against the contract.
// A failure prints the scenario as JSON and the command that replays it.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the scenario tester")
	}
	seeds := seedsToRun(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runScenario(t, seed) })
	}
}

func seedsToRun(t *testing.T) []uint64 {
	switch {
	case *scenarioSeed != 0:
		return []uint64{*scenarioSeed}
	case *scenarioN > 0 || *scenarioDuration > 0:
		n := *scenarioN
		if n == 0 {
			n = 1 << 30
		}
		var out []uint64
		for range min(n, 100000) {
			out = append(out, rand.Uint64()%1_000_000_000+1000)
		}
		return out
	}
	out := append([]uint64(nil), fixedSeeds...)
	for range *scenarioFresh {
		s := rand.Uint64()%1_000_000_000 + 1000
		t.Logf("fresh seed %d", s)
		out = append(out, s)
	}
	return out
}

var scenarioStarted = time.Now()

func runScenario(t *testing.T, seed uint64) {
	if *scenarioDuration > 0 && time.Since(scenarioStarted) > *scenarioDuration {
		t.Skip("-scenario.duration reached")
	}
	sc := scenario.Generate(seed, scenario.Options{Multiprocess: *scenarioMulti})
	o := scenario.RunOptions{Logf: t.Logf}
	if *scenarioMulti {
		o.Start = multiprocessStack(t)
	}
	ctx := context.Background()
	rep := scenario.RunAndCheck(ctx, sc, o)
	t.Log(rep.Summary())
	if dir := os.Getenv("SCENARIO_DUMP"); dir != "" {
		path := filepath.Join(dir, fmt.Sprintf("seed-%d.json", seed))
		t.Logf("observation in %s: %v", path, rep.Dump(path))
	}
	if !rep.Failed() {
		return
	}
	unknown := scenario.Unknown(rep.Failures)
	if rep.Err == nil && len(unknown) == 0 && !*scenarioKnown {
		t.Skipf("known failing until fixed (%v); -scenario.known makes it fail", scenario.Causes(rep.Failures))
	}
	t.Logf("scenario:\n%s", sc.JSON())
	if *scenarioShrink > 0 && rep.Err == nil {
		small, srep := scenario.Shrink(ctx, sc, o, rep, *scenarioShrink)
		if small != sc {
			t.Logf("shrunk to (%s):\n%s\n%s", small.Shrunk, small.JSON(), srep.Summary())
		}
	}
	t.Errorf("seed %d failed; replay: %s", seed, scenario.ReplayCommand(seed, *scenarioMulti))
}
