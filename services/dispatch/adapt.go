package dispatch

import (
	"cmp"
	"slices"
	"time"
)

// rateControl is the control law of adaptive pacing: it turns the answers
// of an account's provider calls into the rate the account is paced at. It
// is pure arithmetic on the times it is given (no clock, no lock), so it is
// driven in real time by pacer and in virtual time by the simulation in
// adapt_test.go.
//
// A rate-limit answer is evidence, not proof, that the account is too fast:
// providers also refuse at random (noise, independent of the rate), refuse
// everything for a while (storms), or limit at a capacity below the
// configured rate. Linear AIMD cannot serve both of the first and the
// third: a cut small enough to ride out 5 % noise overshoots a capacity
// with many refusals, and one large enough for a capacity collapses under
// noise. The law counts answers per window of one second (adaptWindow)
// and tells the cases apart:
//
//   - Capacity. A window refused beyond the noise, with most answers
//     accepted, says the capacity is below the rate: that rate becomes the
//     limit, and the rate drops to the hold rate: runShare of what the
//     unrefused windows just before were accepted at, or holdShare of the
//     rate near the previous limit (a probe that went too far), or
//     capacityCut of it when nothing is known yet (to get below the
//     capacity soon). It holds there for holdTime, then probes above it,
//     slowly at first and faster the longer it goes unrefused
//     (probeTarget), so a lifted limit is found again.
//   - Noise. Every window refused beyond the noise begins or extends an
//     episode, the answers counted per rate tried (levels). When the
//     episode has tried rates down to 0.7 of its first and the lower ones
//     were refused about as often as the higher ones (rateIndependent),
//     the refusals are noise: the rate returns to where the episode
//     began, and for noiseMemory a window refused within twice that share
//     (plus two refusals of slack) changes nothing and the rate keeps
//     rising; such windows well below a limit also forget the limit. A
//     capacity shows the other way: refusals vanish just below it. So a
//     window with one or two refusals and no Retry-After, at or below the
//     hold rate, is noise too (at least minNoise): a capacity above
//     the hold refuses nothing there, one below it refuses every send
//     above it. A run of refused windows refused more often than any
//     noise the law tolerates (twice maxNoise, plus two refusals over the
//     run) is never noise, refutes a noise found, and keeps the test off
//     for noiseMemory: with a Retry-After pause after every refusal,
//     windows hold two or three answers, which two refusals of slack a
//     window would always excuse (a rate above a one-deep capacity then
//     stays there, a send a second: seed 841142931).
//   - Storms. A window of four answers or more, mostly refused, cuts by
//     half its refused share (DCTCP's α/2). stormRefusals refusals with
//     nothing accepted for stormTime drop the rate to the floor and forget
//     the limit: a provider refusing everything says nothing about a
//     capacity.
//
// Below its target (the ceiling, or the hold rate and then the probe when
// a limit is known) the rate rises by recoverGrowth a window: from the
// floor (a twentieth) to the ceiling in about 14 s. Answers other than
// rate limits (sent, 5xx, timeouts, permanent errors) count as accepted:
// they are not the provider saying "too fast".
type rateControl struct {
	ceiling, floor float64
	rate           float64

	// The current window: its start, its answers (n) and refusals (k),
	// and how many of these paused the account (a Retry-After).
	winStart time.Time
	n, k     int
	paused   int

	// noise is the moving average of the refused share per window, at
	// most maxNoise.
	noise float64
	// runN and runK are the answers and refusals of the refused windows
	// in a row up to the current one (runBeyondNoise).
	runN, runK int
	// limit is the rate at the last capacity-like window (0: none known
	// since the last storm, the last noise finding, or since the ceiling was
	// reached unrefused), and limitAt when it was set.
	limit   float64
	limitAt time.Time
	// hold is the rate set by the last capacity-like window, held for
	// holdTime before probing above it.
	hold float64
	// clean are the answers and spans of the last unrefused windows in a
	// row (at most len(clean)), newest last: their rate is what the
	// provider took just before a refusal.
	clean  [3]cleanWindow
	nClean int
	// okAt is the last accepted answer, refusedSinceOK the refusals since.
	okAt           time.Time
	refusedSinceOK int
	// noiseUntil is when the noise share found by the last rate-independence
	// test is forgotten (zero: none found).
	noiseUntil time.Time
	// refutedUntil: a noise share found was refuted (runBeyondNoise), and
	// until then the rate-independence test is not run again.
	refutedUntil time.Time
	// refusedAt is the end of the last window with a refusal.
	refusedAt time.Time
	// levels are the rates of the current episode of refusals, with their
	// answers, in the order tried (see note).
	levels []level
}

// cleanWindow is an unrefused window's answers and length.
type cleanWindow struct {
	n    int
	span time.Duration
}

// level is the answers counted at one rate during an episode.
type level struct {
	rate float64
	n, k int
}

// Constants of the control law (see rateControl).
const (
	// adaptWindow is the span over which answers are counted before the
	// rate is decided again.
	adaptWindow = time.Second
	// noiseGain is the weight of a window in the noise average.
	noiseGain = 0.2
	// capacityCut is the factor applied on a capacity-like window far from
	// the known limit.
	capacityCut = 0.8
	// holdShare is the share of its rate an account keeps after a
	// capacity-like window near the known limit (and at most after any).
	holdShare = 0.93
	// nearLimit: a capacity-like window at or above this share of limit is
	// a probe that went too far.
	nearLimit = 0.9
	// recoverGrowth is the factor per window by which the rate rises while
	// below its target.
	recoverGrowth = 1.25
	// holdTime is how long the rate holds at the hold rate before probing.
	holdTime = 20 * time.Second
	// probeTime is the time scale of probing: the probe target rises by
	// half the hold rate per probeTime squared.
	probeTime = 30 * time.Second
	// runShare is the share held of the rate of the unrefused windows
	// right before a capacity-like one.
	runShare = 0.95
	// episodeQuiet ends an episode of refusals.
	episodeQuiet = 5 * time.Second
	// stormRefusals refusals and no acceptance for stormTime make a storm.
	stormRefusals = 4
	stormTime     = 3 * time.Second
	// noiseMemory is how long a noise share found by the rate-independence
	// test is tolerated before it is tested again.
	noiseMemory = time.Minute
	// maxNoise is the largest refused share told from a capacity as noise.
	maxNoise = 0.15
	// minNoise is the smallest noise share that earns a window two
	// refusals of slack (noiseTolerance); a noise learnt at the hold rate
	// starts there at least.
	minNoise = 0.005
)

func newRateControl(ceiling, floor float64) rateControl {
	return rateControl{ceiling: ceiling, floor: min(floor, ceiling), rate: ceiling}
}

// configure applies an account edit. An account running at its old
// ceiling takes the new one at once; a slowed one keeps its reduction
// within the new bounds.
func (c *rateControl) configure(ceiling, floor float64) {
	if c.rate >= c.ceiling {
		c.rate = ceiling
	}
	c.ceiling, c.floor = ceiling, min(floor, ceiling)
	c.rate = min(max(c.rate, c.floor), c.ceiling)
}

// observe counts one answer at now; limited is a rate-limit answer, and
// paused one that paused the account (it had a Retry-After). It returns
// whether the rate changed (a window ended before this answer).
func (c *rateControl) observe(now time.Time, limited, paused bool) bool {
	changed := c.tick(now)
	if c.winStart.IsZero() {
		c.winStart = now
	}
	c.n++
	if limited {
		c.k++
		if paused {
			c.paused++
		}
		c.refusedSinceOK++
	} else {
		c.okAt, c.refusedSinceOK = now, 0
	}
	return changed
}

// tick ends the current window if adaptWindow has passed since it began,
// and decides the rate from it. It returns whether the rate changed.
func (c *rateControl) tick(now time.Time) bool {
	if c.winStart.IsZero() || now.Sub(c.winStart) < adaptWindow {
		return false
	}
	n, k, paused, span := c.n, c.k, c.paused, now.Sub(c.winStart)
	c.winStart, c.n, c.k, c.paused = time.Time{}, 0, 0, 0
	if n == 0 {
		return false
	}
	before := c.rate
	c.decide(now, n, k, paused)
	if k == 0 {
		copy(c.clean[:], c.clean[1:])
		c.clean[len(c.clean)-1] = cleanWindow{n: n, span: span}
		c.nClean = min(c.nClean+1, len(c.clean))
	} else {
		c.nClean = 0
	}
	return c.rate != before
}

// decide sets the rate after a window of n answers, k of them refused
// (paused of these with a Retry-After).
func (c *rateControl) decide(now time.Time, n, k, paused int) {
	share := float64(k) / float64(n)
	if k > 0 {
		c.refusedAt = now
		c.runN, c.runK = c.runN+n, c.runK+k
	} else {
		c.runN, c.runK = 0, 0
	}
	if !c.noiseUntil.IsZero() && now.After(c.noiseUntil) {
		c.noise, c.noiseUntil = 0, time.Time{}
	}
	c.note(n, k)
	switch {
	case k > 0 && c.refusedSinceOK >= stormRefusals && now.Sub(c.okAt) >= stormTime:
		// Nothing accepted for a while, only refusals: a storm. It says
		// nothing about a capacity.
		c.rate, c.limit, c.levels = c.floor, 0, c.levels[:0]
	case k == 0:
		if now.Sub(c.refusedAt) >= episodeQuiet {
			c.levels = c.levels[:0]
		}
		c.rise(now)
	case 2*k > n && n >= 4:
		// Mostly refused: a storm beginning, or far too fast.
		c.rate = max(c.floor, c.rate*(1-share/2))
	case c.withinNoise(n, k):
		// As often refused as the noise explains. Refusals well below the
		// limit at that share say the limit was noise too: forget it.
		c.noise = min(maxNoise, c.noise+noiseGain*(share-c.noise))
		if c.limit > 0 && c.rate < nearLimit*c.limit {
			c.limit = 0
		}
		c.rise(now)
	default:
		if c.noise > 0 && c.runBeyondNoise() {
			// No noise explains these refusals: they come from a capacity
			// after all, and the test that found the noise is not trusted
			// again for a while.
			c.noise, c.noiseUntil, c.refutedUntil = 0, time.Time{}, now.Add(noiseMemory)
		}
		if k <= 2 && paused == 0 && c.limit > 0 && c.rate <= c.hold && share <= maxNoise {
			// A refusal or two without a pause while holding below a
			// limit found: a capacity there, with nothing pausing the
			// account, would refuse nothing or many a second, so they are
			// noise. Cutting at each ratchets the account down (seed
			// 172036530: 39/s over a 28/s capacity with 3.6 % noise fell
			// to 4/s); a capacity that fell below the hold by more than
			// two sends a second is beyond the tolerance this share gives,
			// and is cut for then. With a Retry-After after each refusal
			// a capacity shows as one refusal a pause, as noise does, and
			// a refusal at the hold rate says the hold is too high.
			c.noise = min(maxNoise, max(c.noise, noiseGain*share, minNoise))
			c.noiseUntil = now.Add(noiseMemory)
			c.rise(now)
			return
		}
		if p, ok := c.rateIndependent(now); ok {
			// Cutting did not make refusals rarer: noise. Go back to where
			// the episode began and tolerate that share from now on; the
			// refusals from here on must be explained by it.
			c.noise, c.noiseUntil = p, now.Add(noiseMemory)
			c.rate = min(c.ceiling, c.levels[0].rate)
			c.limit, c.levels = 0, c.levels[:0]
			c.runN, c.runK = 0, 0
			return
		}
		// Capacity: remember where, and cut. Near the previous limit, or
		// after unrefused windows (whose rate is about the capacity: the
		// provider took it until now), a little below; otherwise by
		// capacityCut, to get below it soon.
		near := c.limit > 0 && c.rate >= nearLimit*c.limit
		c.limit, c.limitAt = c.rate, now
		switch {
		case c.nClean >= 2:
			c.rate = min(holdShare*c.rate, runShare*c.cleanRate())
		case near:
			c.rate = holdShare * c.rate
		default:
			c.rate = capacityCut * c.rate
		}
		c.rate = max(c.floor, c.rate)
		c.hold = c.rate
	}
}

// note adds a window's answers to the episode's level at the current rate.
// An episode begins with a window refused beyond the noise and ends after
// episodeQuiet without refusals.
func (c *rateControl) note(n, k int) {
	if len(c.levels) == 0 && (k == 0 || c.withinNoise(n, k)) {
		return
	}
	if l := len(c.levels); l > 0 && c.levels[l-1].rate == c.rate {
		c.levels[l-1].n += n
		c.levels[l-1].k += k
		return
	}
	c.levels = append(c.levels, level{rate: c.rate, n: n, k: k})
}

// rateIndependent reports whether the episode's refusals look independent
// of the rate, and their share: no noise found was refuted within
// noiseMemory before now, the run of refused windows is not beyond any
// noise, and the episode spans at least three rates, the lowest
// at most 0.7 of the highest, with four refusals or more, at most 15 %
// refused overall, and the answers at the lower rates (half of them)
// refused at least 0.6 times as often as those at the higher rates. A
// capacity makes refusals rarer as the rate comes down to it; noise does
// not. Noise of more than 15 % is not told from a capacity far below.
func (c *rateControl) rateIndependent(now time.Time) (float64, bool) {
	if len(c.levels) < 3 || now.Before(c.refutedUntil) || c.runBeyondNoise() {
		return 0, false
	}
	lo, hi := c.levels[0].rate, c.levels[0].rate
	n, k := 0, 0
	for _, l := range c.levels {
		lo, hi = min(lo, l.rate), max(hi, l.rate)
		n, k = n+l.n, k+l.k
	}
	share := float64(k) / float64(n)
	if lo > 0.7*hi || k < 4 || share > maxNoise {
		return 0, false
	}
	// Split at half the answers, the higher rates first: the levels are
	// short (each ends with a refusal), so halves by rate can be a few
	// answers.
	byRate := slices.Clone(c.levels)
	slices.SortFunc(byRate, func(a, b level) int { return cmp.Compare(b.rate, a.rate) })
	var nLo, kLo, nHi, kHi int
	for _, l := range byRate {
		if 2*nHi < n {
			nHi, kHi = nHi+l.n, kHi+l.k
		} else {
			nLo, kLo = nLo+l.n, kLo+l.k
		}
	}
	if nLo == 0 || nHi == 0 || kHi == 0 {
		return 0, false
	}
	return share, float64(kLo)/float64(nLo) >= 0.6*float64(kHi)/float64(nHi)
}

// cleanRate is the answers per second of the last unrefused windows.
func (c *rateControl) cleanRate() float64 {
	n, span := 0, time.Duration(0)
	for _, w := range c.clean[len(c.clean)-c.nClean:] {
		n, span = n+w.n, span+w.span
	}
	return float64(n) / span.Seconds()
}

// withinNoise reports whether the noise explains a window of n answers, k
// of them refused, and the run of refused windows it ends.
func (c *rateControl) withinNoise(n, k int) bool {
	return c.noise > 0 && float64(k)/float64(n) <= c.noiseTolerance(n) && !c.runBeyondNoise()
}

// runBeyondNoise reports whether the refused windows in a row up to the
// current one (runN, runK) were refused more often than any noise the law
// tolerates: twice maxNoise, plus two refusals over the run.
func (c *rateControl) runBeyondNoise() bool {
	return c.runN > 0 && float64(c.runK) > 2*maxNoise*float64(c.runN)+2
}

// noiseTolerance is the refused share of a window of n answers that the
// noise explains: twice its average, plus two refusals' worth once there
// is any noise (with none, every refusal counts).
func (c *rateControl) noiseTolerance(n int) float64 {
	t := 2 * c.noise
	if c.noise >= minNoise {
		t += 2 / float64(n)
	}
	return t
}

// rise moves the rate towards its target after an unrefused window: by
// recoverGrowth while below it, never above the ceiling.
func (c *rateControl) rise(now time.Time) {
	target := c.ceiling
	if c.limit > 0 {
		target = min(c.ceiling, c.probeTarget(now.Sub(c.limitAt)))
		if target >= c.ceiling && c.rate >= c.ceiling {
			c.limit = 0 // the ceiling holds unrefused: the limit is gone
		}
	}
	if c.rate < target {
		c.rate = min(target, c.rate*recoverGrowth)
	}
	c.rate = min(max(c.rate, c.floor), c.ceiling)
}

// probeTarget is the rate aimed at d after the limit was set: the hold
// rate for holdTime, then rising with the square of the time since.
func (c *rateControl) probeTarget(d time.Duration) float64 {
	if d <= holdTime {
		return c.hold
	}
	x := (d - holdTime).Seconds() / probeTime.Seconds()
	return c.hold * (1 + 0.5*x*x)
}
