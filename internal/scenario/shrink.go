package scenario

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Shrink tries smaller variants of a failing scenario, one removal at a
// time (a kill, an action, a task, an account, a fault, half of a task's
// recipients), keeping each that still fails the same checks, until no
// removal does or budget runs out. It returns the smallest failing
// scenario found (sc itself when none is smaller) and its report.
func Shrink(ctx context.Context, sc *Scenario, o RunOptions, rep *Report, budget time.Duration) (*Scenario, *Report) {
	deadline := time.Now().Add(budget)
	want := checksOf(rep.Failures)
	best, bestRep := sc, rep
	var removed []string
	quiet := o
	quiet.Logf = nil
	for progress := true; progress && time.Now().Before(deadline); {
		progress = false
		for _, cand := range candidates(best) {
			if time.Now().After(deadline) {
				break
			}
			r := RunAndCheck(ctx, cand.sc, quiet)
			if r.Err == nil && overlaps(checksOf(r.Failures), want) {
				best, bestRep = cand.sc, r
				removed = append(removed, cand.what)
				best.Shrunk = strings.Join(removed, "; ")
				if o.Logf != nil {
					o.Logf("shrink: without %s it still fails (%s)", cand.what, strings.Join(checksOf(r.Failures), ","))
				}
				progress = true
				break
			}
		}
	}
	return best, bestRep
}

func checksOf(fs []Failure) []string {
	var out []string
	for _, f := range fs {
		k := f.Check + "/" + f.Known
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

type candidate struct {
	what string
	sc   *Scenario
}

// candidates are the one-step reductions of s, cheapest to run first.
func candidates(s *Scenario) []candidate {
	var out []candidate
	add := func(what string, edit func(c *Scenario) bool) {
		c := s.Clone()
		c.Shrunk = ""
		if edit(c) {
			out = append(out, candidate{what, c})
		}
	}
	if s.Replicas > 1 && !slices.ContainsFunc(s.Kills, func(k Kill) bool { return k.Replica > 0 }) {
		add("replicas", func(c *Scenario) bool {
			c.Replicas = 0
			return true
		})
	}
	for i := range s.Kills {
		add(fmt.Sprintf("kill %d (%s)", i, s.Kills[i].Target()), func(c *Scenario) bool {
			c.Kills = slices.Delete(c.Kills, i, i+1)
			return true
		})
	}
	for i := range s.Actions {
		add(fmt.Sprintf("action %d (%s %s%s)", i, s.Actions[i].Kind, s.Actions[i].Task, s.Actions[i].Account), func(c *Scenario) bool {
			c.Actions = slices.Delete(c.Actions, i, i+1)
			return true
		})
	}
	for i := range s.Tasks {
		if len(s.Tasks) > 1 {
			id := s.Tasks[i].ID
			add("task "+id, func(c *Scenario) bool {
				c.Tasks = slices.Delete(c.Tasks, i, i+1)
				c.Actions = slices.DeleteFunc(c.Actions, func(a Action) bool { return a.Task == id })
				return true
			})
		}
		if n := len(s.Tasks[i].Recipients); n > 4 {
			add(fmt.Sprintf("half the recipients of %s", s.Tasks[i].ID), func(c *Scenario) bool {
				c.Tasks[i].Recipients = c.Tasks[i].Recipients[:n/2]
				c.Tasks[i].Repeats = min(c.Tasks[i].Repeats, n/2)
				return true
			})
		}
	}
	for pi := range s.Pools {
		for ai, a := range s.Pools[pi].Accounts {
			if len(s.Pools[pi].Accounts) > 1 {
				add("account "+a.Name, func(c *Scenario) bool {
					c.Pools[pi].Accounts = slices.Delete(c.Pools[pi].Accounts, ai, ai+1)
					c.Actions = slices.DeleteFunc(c.Actions, func(x Action) bool { return x.Account == a.Name })
					for ti := range c.Tasks {
						c.Tasks[ti].Accounts = slices.DeleteFunc(c.Tasks[ti].Accounts, func(n string) bool { return n == a.Name })
					}
					return true
				})
			}
			if a.Faults != (Faults{}) {
				add("faults of "+a.Name, func(c *Scenario) bool {
					c.Pools[pi].Accounts[ai].Faults = Faults{}
					return true
				})
			}
		}
	}
	return out
}
