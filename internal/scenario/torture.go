package scenario

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"
)

// TortureConfig tunes Torture, the long mode behind `broadcast torture`.
type TortureConfig struct {
	// Seed is the first seed; 0 draws a fresh one per scenario.
	Seed uint64
	// N is how many scenarios run (seeds Seed, Seed+1, ...). Defaults to 1.
	N int
	// Duration, when set, keeps drawing scenarios until it has passed
	// (N is then ignored).
	Duration time.Duration
	// Multiprocess draws process kills; Start must then run processes.
	Multiprocess bool
	// Start starts the stacks. Defaults to StartInProcess.
	Start StartFunc
	// Shrink is how long a failing scenario may be shrunk. Defaults to 0
	// (not shrunk).
	Shrink time.Duration
	// Strict counts known causes as failures.
	Strict bool
	// Verbose writes the runner's timeline.
	Verbose bool
	// Out receives a summary per scenario. Required.
	Out io.Writer
}

// TortureResult counts what Torture ran.
type TortureResult struct {
	Ran    int
	Failed []uint64 // failures with an unknown cause (all, when Strict)
	Known  []uint64 // failures with known causes only
}

// Torture runs scenarios one after another, printing each verdict, the
// scenario of every failure as JSON and the command that replays it.
func Torture(ctx context.Context, c TortureConfig) TortureResult {
	var res TortureResult
	if c.N <= 0 {
		c.N = 1
	}
	start := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		if c.Duration > 0 {
			if time.Since(start) > c.Duration {
				break
			}
		} else if i >= c.N {
			break
		}
		seed := c.Seed + uint64(i)
		if c.Seed == 0 {
			seed = rand.Uint64()%1_000_000_000 + 1000
		}
		sc := Generate(seed, Options{Multiprocess: c.Multiprocess})
		o := RunOptions{Start: c.Start}
		if c.Multiprocess {
			o.Slack = 30 * time.Second
		}
		if c.Verbose {
			o.Logf = func(f string, a ...any) { fmt.Fprintf(c.Out, "  "+f+"\n", a...) }
		}
		rep := RunAndCheck(ctx, sc, o)
		res.Ran++
		fmt.Fprint(c.Out, rep.Summary())
		if !rep.Failed() {
			continue
		}
		if rep.Err == nil && len(Unknown(rep.Failures)) == 0 && !c.Strict {
			res.Known = append(res.Known, seed)
			continue
		}
		res.Failed = append(res.Failed, seed)
		fmt.Fprintf(c.Out, "  scenario: %s\n", sc.JSON())
		if c.Shrink > 0 && rep.Err == nil {
			if small, srep := Shrink(ctx, sc, o, rep, c.Shrink); small != sc {
				fmt.Fprintf(c.Out, "  shrunk (%s): %s\n  %s", small.Shrunk, small.JSON(), srep.Summary())
			}
		}
		fmt.Fprintf(c.Out, "  replay: %s\n", ReplayCommand(seed, c.Multiprocess))
	}
	fmt.Fprintf(c.Out, "%d scenarios in %s: %d failed %v, %d known-cause only %v\n",
		res.Ran, time.Since(start).Round(time.Second), len(res.Failed), res.Failed, len(res.Known), res.Known)
	return res
}
