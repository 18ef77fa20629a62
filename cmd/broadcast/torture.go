package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/broadcastd/broadcast/internal/scenario"
)

// runTorture runs the randomized scenario tester (internal/scenario) from
// the command line: the long mode of `go test ./e2e/scenarios -run TestScenarios`.
func runTorture(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("torture", flag.ExitOnError)
	seed := fs.Uint64("seed", 0, "first seed (0: a fresh random seed per scenario)")
	n := fs.Int("n", 1, "number of scenarios (seeds seed, seed+1, ...)")
	d := fs.Duration("duration", 0, "keep running scenarios this long (overrides -n)")
	multi := fs.Bool("multiprocess", false, "run the services as processes of this binary, with kill -9 and nats-server restarts")
	shrink := fs.Duration("shrink", time.Minute, "time allowed to shrink a failing scenario (0: none)")
	strict := fs.Bool("strict", false, "count the known causes (being fixed elsewhere) as failures")
	verbose := fs.Bool("v", false, "print each scenario's timeline")
	_ = fs.Parse(args)
	c := scenario.TortureConfig{Seed: *seed, N: *n, Duration: *d, Multiprocess: *multi, Shrink: *shrink,
		Strict: *strict, Verbose: *verbose, Out: os.Stdout}
	if *multi {
		bin, err := os.Executable()
		if err != nil {
			return err
		}
		c.Start = scenario.StartProcesses(bin)
	}
	res := scenario.Torture(ctx, c)
	if len(res.Failed) > 0 {
		return fmt.Errorf("%d of %d scenarios failed: seeds %v", len(res.Failed), res.Ran, res.Failed)
	}
	return nil
}
