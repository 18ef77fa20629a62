package contract

import (
	"math"
	"time"
)

// Warmup is an account's warm-up ramp (account field "warmup"): a new
// sender starts at Start distinct recipients a day and grows by Growth
// each day from Since, up to Max. The ramp is one more cap beside
// daily_cap and the provider's limit; the lowest of them applies.
type Warmup struct {
	Start  int     `json:"start"`
	Growth float64 `json:"growth"`
	// Max ends the ramp; 0 lets it grow until daily_cap or the provider's
	// limit is the lower one.
	Max int `json:"max,omitempty"`
	// Since is the ramp's first day, YYYY-MM-DD in UTC.
	Since string `json:"since"`

	since time.Time
}

// MaxWarmupGrowth bounds the daily growth factor.
const MaxWarmupGrowth = 10

func (w *Warmup) check() error {
	if w.Start < 1 || w.Start > MaxDailyCap {
		return fieldErr("warmup.start", "must be between 1 and %d, got %d", MaxDailyCap, w.Start)
	}
	if !(w.Growth >= 1 && w.Growth <= MaxWarmupGrowth) {
		return fieldErr("warmup.growth", "must be between 1 and %d, got %v", MaxWarmupGrowth, w.Growth)
	}
	if w.Max != 0 && (w.Max < w.Start || w.Max > MaxDailyCap) {
		return fieldErr("warmup.max", "must be 0 (none) or between start (%d) and %d, got %d", w.Start, MaxDailyCap, w.Max)
	}
	t, err := time.Parse(time.DateOnly, w.Since)
	if err != nil {
		return fieldErr("warmup.since", "want a date YYYY-MM-DD, got %q", truncate(w.Since, 32))
	}
	w.since = t
	return nil
}

// Day is the ramp's day at now: 0 on Since (and before it), 1 the next
// UTC day, and so on.
func (w *Warmup) Day(now time.Time) int {
	if w == nil || !now.After(w.since) {
		return 0
	}
	return int(now.UTC().Sub(w.since) / (24 * time.Hour))
}

// CapAt is the ramp's daily cap at now: Start × Growth^day, at most Max.
func (w *Warmup) CapAt(now time.Time) int {
	if w == nil {
		return 0
	}
	limit := float64(MaxDailyCap)
	if w.Max > 0 {
		limit = float64(w.Max)
	}
	// The small addend keeps 50 × 1.4² (97.999…) at 98.
	c := math.Floor(float64(w.Start)*math.Pow(w.Growth, float64(w.Day(now))) + 1e-6)
	if math.IsInf(c, 0) || math.IsNaN(c) || c > limit {
		c = limit
	}
	return int(c)
}
