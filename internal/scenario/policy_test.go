package scenario

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// The policy draws are deterministic, on in a share of seeds and off in
// the rest, and they leave the rest of a scenario as it was.
func TestGeneratePolicy(t *testing.T) {
	caps, supp, none := 0, 0, 0
	for seed := uint64(1); seed <= 400; seed++ {
		s := Generate(seed, Options{})
		if !reflect.DeepEqual(s, Generate(seed, Options{})) {
			t.Fatalf("seed %d: two scenarios", seed)
		}
		if s.FrequencyCap > 0 {
			caps++
		}
		if len(s.Suppressions) > 0 {
			supp++
		}
		if s.FrequencyCap == 0 && len(s.Suppressions) == 0 {
			none++
			for _, tk := range s.Tasks {
				if tk.Category != "" {
					t.Fatalf("seed %d: a category without a policy", seed)
				}
			}
		}
		for _, e := range s.Suppressions {
			if s.Pool(e.Channel) == nil || (e.Scope != e.Channel && e.Scope != "all") {
				t.Fatalf("seed %d: bad entry %+v", seed, e)
			}
		}
	}
	if caps < 60 || supp < 60 || none < 120 {
		t.Errorf("caps %d, suppressions %d, none %d of 400 seeds", caps, supp, none)
	}
}

// Seed 8's scenario (a fixed seed) draws no policy and is what it was.
func TestGeneratePolicyKeepsFixedSeeds(t *testing.T) {
	s := Generate(8, Options{})
	if len(s.Tasks) == 0 || s.Tasks[0].ID != "s8-t0" {
		t.Fatalf("seed 8: %s", s.JSON())
	}
}

// TestCheckPolicy: the checker reports a recipient suppressed before its
// task's submission but sent, a recipient reached by more capped tasks
// than the cap, and a frequency_cap skip without reason; and accepts a
// run that keeps the policy.
func TestCheckPolicy(t *testing.T) {
	t.Parallel()
	start := time.Now()
	sc := &Scenario{Seed: 1, FrequencyCap: 1,
		Pools: []Pool{{Channel: "webhook", Accounts: []Account{{Name: "hook-a", RatePerSec: 50, Burst: 5}}}},
		Tasks: []Task{
			{ID: "a", Channel: "webhook", Recipients: []int{0, 1, 2}},
			{ID: "b", Channel: "webhook", Recipients: []int{0, 1}, Category: "marketing"},
		},
		Suppressions: []Suppression{{Channel: "webhook", Index: 2, Scope: "all", Early: true}},
	}
	hit := func(task, to string, at time.Duration, key string) Hit {
		return Hit{At: start.Add(at), Call: int(at/time.Millisecond) + 1, Account: "hook-a", Task: task, To: to, Key: key, Attempt: 1, Status: 200, Accepted: true}
	}
	ev := func(task string, i int, to string, kind contract.EventKind, code string) contract.Event {
		return contract.Event{TaskID: task, JobID: contract.JobID(task, i, false), To: to, Account: "hook-a", Kind: kind, Code: code, Index: i, Attempt: 1}
	}
	good := func() *Observation {
		fin := start.Add(5 * time.Second)
		return &Observation{Scenario: sc, Start: start,
			Hits: map[string][]Hit{"hook-a": {hit("a", "r-0000", 0, "a.0"), hit("a", "r-0001", 100*time.Millisecond, "a.1")}},
			Progress: map[string]*contract.Progress{
				"a": {TaskID: "a", State: contract.StatePartial, Total: 3, Sent: 2, Skipped: 1},
				"b": {TaskID: "b", State: contract.StatePartial, Total: 2, Skipped: 2},
			},
			Events: map[string][]contract.Event{
				"a": {ev("a", 0, "r-0000", contract.EventSent, ""), ev("a", 1, "r-0001", contract.EventSent, ""), ev("a", 2, "r-0002", contract.EventSkipped, contract.CodeSuppressed)},
				"b": {ev("b", 0, "r-0000", contract.EventSkipped, contract.CodeFrequencyCap), ev("b", 1, "r-0001", contract.EventSkipped, contract.CodeFrequencyCap)},
			},
			Submitted:    map[string]time.Time{"a": start, "b": start},
			Submitting:   map[string]time.Time{"a": start, "b": start},
			SuppressedAt: []time.Time{start.Add(-time.Second)},
			Deadline:     map[string]time.Time{"a": fin, "b": fin}, Final: map[string]time.Time{"a": fin, "b": fin},
		}
	}
	require.Empty(t, Check(good()))
	checks := func(o *Observation) []string {
		var out []string
		for _, f := range Check(o) {
			out = append(out, f.Check)
		}
		return out
	}

	o := good()
	o.Hits["hook-a"] = append(o.Hits["hook-a"], hit("a", "r-0002", 200*time.Millisecond, "a.2"))
	o.Events["a"][2] = ev("a", 2, "r-0002", contract.EventSent, "")
	o.Progress["a"].Sent, o.Progress["a"].Skipped = 3, 0
	require.Contains(t, checks(o), CheckSuppress, "sent though suppressed before submission")
	o.SuppressedAt[0] = start.Add(time.Second)
	require.NotContains(t, checks(o), CheckSuppress, "an entry put after submission may race the send")

	o = good()
	o.Hits["hook-a"] = append(o.Hits["hook-a"], hit("b", "r-0000", 300*time.Millisecond, "b.0"))
	o.Events["b"][0] = ev("b", 0, "r-0000", contract.EventSent, "")
	o.Progress["b"].Sent, o.Progress["b"].Skipped = 1, 1
	require.Contains(t, checks(o), CheckFreq, "two capped tasks reached r-0000 with a cap of 1")

	o = good()
	o.Hits["hook-a"] = o.Hits["hook-a"][:1]
	o.Events["a"][1] = ev("a", 1, "r-0001", contract.EventCancelled, "")
	o.Progress["a"].State, o.Progress["a"].Sent, o.Progress["a"].Cancelled = contract.StateCancelled, 1, 1
	require.Contains(t, checks(o), CheckFreq, "skipped for the cap though no other task reached r-0001")

	// Seed 916710390: the entry was replaced, under the same key, by one
	// for transactional messages only before the task came.
	o = good()
	o.Hits["hook-a"] = append(o.Hits["hook-a"], hit("a", "r-0002", 200*time.Millisecond, "a.2"))
	o.Events["a"][2] = ev("a", 2, "r-0002", contract.EventSent, "")
	o.Progress["a"].Sent, o.Progress["a"].Skipped = 3, 0
	replaced := *sc
	replaced.Suppressions = append(slices.Clone(sc.Suppressions), Suppression{Channel: "webhook", Index: 2, Scope: "all", Categories: []string{"transactional"}, Early: true})
	o.Scenario = &replaced
	o.SuppressedAt = append(o.SuppressedAt, start.Add(-time.Second/2))
	require.NotContains(t, checks(o), CheckSuppress, "the entry in force when the task came does not cover it")

	o = good()
	o.Progress["b"].Skipped = 1
	o.Progress["b"].Failed = 1
	require.Contains(t, checks(o), CheckCounts, "two policy skips, one counted")

	// Seed 475226773: a task with an invalid address cancelled before it
	// started (waiting for send_after) has every recipient cancelled, the
	// invalid one too; nothing was skipped.
	o = good()
	withC := *sc
	withC.Tasks = append(slices.Clone(sc.Tasks), Task{ID: "c", Channel: "webhook", Recipients: []int{3}, Invalid: 1})
	o.Scenario = &withC
	o.Progress["c"] = &contract.Progress{TaskID: "c", State: contract.StateCancelled, Total: 2, Cancelled: 2}
	o.Events["c"] = []contract.Event{ev("c", 0, "r-0003", contract.EventCancelled, "cancelled"), ev("c", 1, "not-an-address", contract.EventCancelled, "cancelled")}
	o.Submitted["c"], o.Submitting["c"], o.Deadline["c"], o.Final["c"] = start, start, o.Deadline["a"], o.Final["a"]
	require.Empty(t, Check(o), "invalid addresses of a task cancelled before it started are cancelled, not skipped")
	o.Progress["c"].State = contract.StatePartial
	require.Contains(t, checks(o), CheckCounts, "a task that ran skips its invalid addresses")
}

// TestSuppressionCoversLikeAddressesOfOtherChannels: webhook and sandbox
// recipients share their addresses, so an entry for every channel drawn
// in one covers the other's recipient of that address (seed 596343942
// counted such recipients lost); an entry for its own channel does not.
func TestSuppressionCoversLikeAddressesOfOtherChannels(t *testing.T) {
	t.Parallel()
	hook := Task{Channel: "webhook", Recipients: []int{454, 7}}
	all := Suppression{Channel: "sandbox", Index: 454, Scope: "all"}
	require.True(t, all.Covers(hook, 454))
	require.False(t, all.Covers(hook, 7))
	require.False(t, Suppression{Channel: "sandbox", Index: 454, Scope: "sandbox"}.Covers(hook, 454))
	require.False(t, all.Covers(Task{Channel: "smtp", Recipients: []int{454}}, 454), "other addresses")
	require.False(t, Suppression{Channel: "sandbox", Index: 454, Scope: "all", Categories: []string{"utility"}}.Covers(hook, 454))
}
