package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// Report is one scenario's run and verdict.
type Report struct {
	Scenario *Scenario
	Obs      *Observation
	Failures []Failure
	Took     time.Duration
	// Err is set when the run itself could not be done.
	Err error
}

// Failed reports whether the run broke a promise (known causes included).
func (r *Report) Failed() bool { return r.Err != nil || len(r.Failures) > 0 }

// Summary is a few lines: the verdict and every failure.
func (r *Report) Summary() string {
	var b strings.Builder
	verdict := "ok"
	switch {
	case r.Err != nil:
		verdict = "error: " + r.Err.Error()
	case len(Unknown(r.Failures)) > 0:
		verdict = fmt.Sprintf("FAILED (%d failures)", len(r.Failures))
	case len(r.Failures) > 0:
		verdict = "known failures only: " + strings.Join(Causes(r.Failures), ", ")
	}
	fmt.Fprintf(&b, "seed %d: %s in %s (%s)", r.Scenario.Seed, verdict, r.Took.Round(100*time.Millisecond), r.Scenario.Brief())
	if r.Obs != nil && len(r.Obs.Stalls) > 0 {
		var longest time.Duration
		for _, s := range r.Obs.Stalls {
			longest = max(longest, s.To.Sub(s.From))
		}
		fmt.Fprintf(&b, "; the fakes' process stalled %d times, longest %s", len(r.Obs.Stalls), longest.Round(time.Millisecond))
	}
	b.WriteString("\n")
	for i, f := range r.Failures {
		if i == 20 {
			fmt.Fprintf(&b, "  ... %d more\n", len(r.Failures)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}

// Brief describes the scenario in one line.
func (s *Scenario) Brief() string {
	var parts []string
	for _, p := range s.Pools {
		parts = append(parts, fmt.Sprintf("%s×%d", p.Channel, len(p.Accounts)))
	}
	n := 0
	for _, t := range s.Tasks {
		n += len(t.Recipients) + len(t.Bad) + t.Invalid
	}
	out := fmt.Sprintf("%s, %d tasks, %d recipients, %d actions, %d kills", strings.Join(parts, "+"), len(s.Tasks), n, len(s.Actions), len(s.Kills))
	if s.Replicas > 1 {
		out += fmt.Sprintf(", %d processes of each service", s.Replicas)
	}
	return out
}

// RunAndCheck runs sc and checks what it observed.
func RunAndCheck(ctx context.Context, sc *Scenario, o RunOptions) *Report {
	start := time.Now()
	obs, err := Run(ctx, sc, o)
	r := &Report{Scenario: sc, Obs: obs, Err: err}
	if err == nil {
		r.Failures = Check(obs)
	}
	r.Took = time.Since(start)
	return r
}

// ReplayCommand is the one-line command that runs the seed again.
func ReplayCommand(seed uint64, multiprocess bool) string {
	if multiprocess {
		return fmt.Sprintf("go test ./e2e/scenarios -run 'TestScenarios/seed=%d$' -scenario.seed=%d -scenario.multiprocess -v", seed, seed)
	}
	return fmt.Sprintf("go test ./e2e/scenarios -run 'TestScenarios/seed=%d$' -scenario.seed=%d -v   # or: go run ./cmd/broadcast torture -seed %d -n 1", seed, seed, seed)
}

// Dump writes the observation as JSON to path, for digging into a failure.
func (r *Report) Dump(path string) error {
	if r.Obs == nil {
		return nil
	}
	b, err := json.MarshalIndent(r.Obs, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
