package scenario

import (
	"reflect"
	"testing"
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
