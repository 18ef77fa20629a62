package dispatch

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func limit(p *pacer) float64 { return float64(p.limiter.Limit()) }

func TestDispatchPacerConfigureUnreducedTakesNewCeiling(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5)
	p.configure(100, 5, 5)
	cur, _ := p.effective()
	require.Equal(t, 100.0, cur, "an account that was never slowed runs at its new rate at once")
	require.Equal(t, 100.0, limit(p))
}

// fakeClock is a settable clock for a pacer.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock           { return &fakeClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)} }

// slowed drives p on clk through windows refused beyond any noise until
// its rate is below ceiling.
func slowed(p *pacer, clk *fakeClock) {
	for range 3 {
		for range 7 {
			p.succeeded()
			clk.add(100 * time.Millisecond)
		}
		for range 3 {
			p.rateLimited(0)
			clk.add(100 * time.Millisecond)
		}
	}
	p.succeeded()
}

func TestDispatchPacerConfigure(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	p := newPacerAt(60, 3, 5, clk.now)
	slowed(p, clk)
	cur, _ := p.effective()
	require.Less(t, cur, 60.0)
	require.Equal(t, cur, limit(p), "the token bucket runs at the effective rate")

	// A higher ceiling keeps the reduction.
	p.configure(100, 3, 5)
	after, ceiling := p.effective()
	require.Equal(t, cur, after)
	require.Equal(t, 100.0, ceiling)

	// A floor above the effective rate lifts it; a lower ceiling caps it.
	p.configure(100, cur+1, 5)
	after, _ = p.effective()
	require.Equal(t, cur+1, after)
	require.Equal(t, cur+1, limit(p))
	p.configure(cur/2, 2, 4)
	after, _ = p.effective()
	require.Equal(t, cur/2, after)
	require.Equal(t, cur/2, limit(p))
	require.Equal(t, 4, p.limiter.Burst())
}

// TestDispatchPacerPauseHoldsEveryPath: during a Retry-After pause no path
// starts a send: no token (the scheduler's wait and its fast path), and no
// admission for a job granted its token before the refusal came, which is
// how a send started 0.47 s into a Retry-After of 3 s. After the pause the
// bucket is empty: no burst.
func TestDispatchPacerPauseHoldsEveryPath(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	p := newPacerAt(40, 2, 5, clk.now)
	require.True(t, p.tryToken(), "a job granted before the refusal")
	p.rateLimited(3 * time.Second)
	start := clk.t
	for _, at := range []time.Duration{0, 470 * time.Millisecond, 2999 * time.Millisecond} {
		clk.t = start.Add(at)
		require.False(t, p.tryToken(), "no token %s into the pause", at)
		ok, wait := p.tokenAt(clk.t, time.Time{})
		require.False(t, ok)
		require.Equal(t, 3*time.Second-at, wait)
		ok, wait, paused := p.admitAt(clk.t)
		require.False(t, ok, "the granted job is not admitted %s into the pause", at)
		require.True(t, paused, "held by the pause: it needs a new token")
		require.Equal(t, 3*time.Second-at, wait)
	}
	clk.t = start.Add(3 * time.Second)
	require.False(t, p.tryToken(), "the bucket starts empty after the pause: no burst")
	clk.add(time.Duration(float64(time.Second) / limit(p)))
	require.True(t, p.tryToken(), "one token per 1/rate: the held job's new one")
	ok, _, _ := p.admitAt(clk.t)
	require.True(t, ok, "admitted once the pause is over")

	// A shorter Retry-After does not cut a longer pause short.
	p.rateLimited(3 * time.Second)
	p.rateLimited(time.Second)
	clk.add(2 * time.Second)
	require.False(t, p.tryToken())
}

// TestDispatchPacerPauseReleasesSendsAtTheRate: sends granted their
// tokens before a refusal, held by its Retry-After, leave at the rate
// after it, not together when it ends. Together, a provider whose bucket
// is one deep refused the second of each pair and paused the account
// again: one send a second for a minute (seed 841142931).
func TestDispatchPacerPauseReleasesSendsAtTheRate(t *testing.T) {
	t.Parallel()
	const held = 4
	p := newPacer(50, 5, held) // the held sends' tokens, taken before the refusal
	for range held {
		require.True(t, p.tryToken())
	}
	p.limiter.SetBurst(1) // a bucket one deep from then on
	const retryAfter = 200 * time.Millisecond
	p.rateLimited(retryAfter)
	pauseEnd := time.Now().Add(retryAfter)
	starts := make(chan time.Time, held)
	var wg sync.WaitGroup
	for range held {
		wg.Go(func() {
			start, err := p.admit(context.Background())
			assert.NoError(t, err)
			starts <- start
		})
	}
	wg.Wait()
	close(starts)
	var got []time.Time
	for s := range starts {
		got = append(got, s)
	}
	slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
	r, _ := p.effective()
	var gaps []string
	for i := range got {
		gaps = append(gaps, got[i].Sub(pauseEnd).Round(time.Millisecond).String())
	}
	t.Logf("rate %.0f/s; the %d held sends started %v after the pause", r, held, gaps)
	require.False(t, got[0].Before(pauseEnd), "none during the pause")
	// The bucket is empty when the pause ends and one deep: the k-th send
	// has waited k tokens' worth at least.
	require.GreaterOrEqual(t, got[held-1].Sub(pauseEnd), time.Duration(0.95*held/r*float64(time.Second)),
		"the held sends leave one per 1/rate")
}

func TestDispatchPacerHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	p := newPacer(1000, 10, 10)
	p.rateLimited(300 * time.Millisecond)
	start := time.Now()
	require.NoError(t, p.wait(context.Background()))
	waited := time.Since(start)
	t.Logf("waited %s for a Retry-After of 300ms", waited.Round(time.Millisecond))
	require.GreaterOrEqual(t, waited, 290*time.Millisecond)
	require.Less(t, waited, time.Second)

	// A cancelled wait returns at once with the context's error.
	p.rateLimited(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.wait(ctx), context.DeadlineExceeded)
}

func TestDispatchPacerPaces(t *testing.T) {
	t.Parallel()
	const r, burst, n = 200.0, 5, 105
	p := newPacer(r, 10, burst)
	start := time.Now()
	for range n {
		require.NoError(t, p.wait(context.Background()))
	}
	elapsed := time.Since(start)
	want := time.Duration(float64(n-burst) / r * float64(time.Second))
	t.Logf("%d waits at %v/s burst %d took %s (ideal %s)", n, r, burst, elapsed.Round(time.Millisecond), want)
	require.GreaterOrEqual(t, elapsed, want-10*time.Millisecond, "never faster than rate after the burst")
	require.Less(t, elapsed, want+150*time.Millisecond)
}

func TestDispatchPacerEmpty(t *testing.T) {
	t.Parallel()
	const r, burst = 100.0, 5
	p := newPacer(r, 10, burst)
	p.empty()
	start := time.Now()
	for range burst {
		require.NoError(t, p.wait(context.Background()))
	}
	elapsed := time.Since(start)
	t.Logf("%d waits after emptying at %v/s took %s", burst, r, elapsed.Round(time.Millisecond))
	require.GreaterOrEqual(t, elapsed, 45*time.Millisecond, "an emptied bucket has no burst: one token per 10ms")

	// After an idle spell the burst is there again.
	time.Sleep(60 * time.Millisecond)
	start = time.Now()
	for range burst {
		require.NoError(t, p.wait(context.Background()))
	}
	require.Less(t, time.Since(start), 5*time.Millisecond, "a refilled bucket sends its burst at once")
}

// TestDispatchPacerWindowBoundsLateSenders: however the token bucket's
// waiters wake, no one-second window admits more than burst + ceil(rate)
// send starts.
func TestDispatchPacerWindowBoundsLateSenders(t *testing.T) {
	t.Parallel()
	p := newPacer(5, 1, 5) // at most 10 starts in any second
	var mu sync.Mutex
	var starts []time.Time
	var wg sync.WaitGroup
	begin := time.Now()
	for range 4 {
		wg.Go(func() {
			for range 5 {
				// Call admit directly: as if every token had been handed
				// out at once to senders that all woke late. The start
				// admit returns is the one the send uses (send.go); a
				// time.Now() taken here after the goroutine is scheduled
				// again drifts by the scheduler's delay (CI once saw 11).
				at, err := p.admit(context.Background())
				require.NoError(t, err)
				mu.Lock()
				starts = append(starts, at)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	best, lo := 0, 0
	for hi := range starts {
		for starts[hi].Sub(starts[lo]) >= time.Second {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	elapsed := time.Since(begin)
	t.Logf("20 starts at 5/s burst 5 offered at once: max %d in any second, took %s", best, elapsed.Round(time.Millisecond))
	require.Equal(t, 10, best)
	require.GreaterOrEqual(t, elapsed, time.Second)
	require.Less(t, elapsed, 1500*time.Millisecond)
}

// TestDispatchPacerGrantsInTicks: a waiter for tokens lets a grantTick's
// worth gather (at most half the burst, at least one), so fast accounts'
// jobs leave together; the rate is the bucket's and any span of length T
// still starts at most burst + rate*T sends.
func TestDispatchPacerGrantsInTicks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rate  float64
		burst int
		want  int // tokens a waiter lets gather
	}{
		{2500, 250, int(2500 * grantTick.Seconds())},
		{100, 5, 1},  // a token every 10 ms: as before
		{2000, 4, 2}, // half the burst
		{20, 1, 1},   // at least one
	} {
		clk := newFakeClock()
		p := newPacerAt(c.rate, c.rate, c.burst, clk.now)
		p.empty()
		ok, wait := p.tokenAt(clk.t, time.Time{})
		require.False(t, ok)
		gap := time.Duration(float64(time.Second) / c.rate)
		require.InDelta(t, float64(time.Duration(c.want)*gap), float64(wait), float64(time.Millisecond),
			"%v/s burst %d waits for %d tokens", c.rate, c.burst, c.want)

		// Driven as the scheduler drives it, waking up to 0.9 ms late: never
		// more than burst + rate*T starts in a span T, and the rate holds.
		var starts []time.Time
		begin := clk.t
		for late := time.Duration(0); clk.t.Sub(begin) < 2*time.Second; late = (late + 300*time.Microsecond) % (900 * time.Microsecond) {
			ok, d := p.tokenAt(clk.t, time.Time{})
			if ok {
				starts = append(starts, clk.t)
				continue
			}
			clk.add(d + late)
		}
		// Starts i..j number j-i+1: at most burst + rate*(t_j - t_i), that
		// is (j+1 - rate*t_j) - (i - rate*t_i) <= burst for every i <= j.
		lowest := math.Inf(1)
		for j, at := range starts {
			x := c.rate * at.Sub(begin).Seconds()
			lowest = min(lowest, float64(j)-x)
			require.LessOrEqual(t, float64(j+1)-x-lowest, float64(c.burst)+1e-6, "%v/s burst %d", c.rate, c.burst)
		}
		got := float64(len(starts)) / clk.t.Sub(begin).Seconds()
		require.InDelta(t, c.rate, got, 0.05*c.rate, "%v/s burst %d: the rate holds", c.rate, c.burst)
	}
}

// TestDispatchPacerLateWakeKeepsTheRate: a waiter for a token that wakes
// late (a busy CPU) takes it as of the moment it waited for when the
// bucket is one token deep, so an account at 15/s with a burst of one
// still gets 15 tokens a second; taken as of the wake, every late wake was
// lost (about 100 in 10 s here). A change of the limiter after that moment
// (an edit) is not counted twice. A deeper bucket takes its token at the
// wake: late by more than it can hold, it loses the rest as before rather
// than let a token more out at once.
func TestDispatchPacerLateWakeKeepsTheRate(t *testing.T) {
	t.Parallel()
	run := func(rate float64, burst int, late time.Duration, edit, asOfDue bool) int {
		clk := newFakeClock()
		p := newPacerAt(rate, 1, burst, clk.now)
		end := clk.t.Add(10 * time.Second)
		var due time.Time
		taken := 0
		for clk.t.Before(end) {
			if edit && !due.IsZero() {
				p.configure(rate, 1, burst)
			}
			asked := time.Time{}
			if asOfDue {
				asked = due
			}
			ok, d := p.tokenAt(clk.t, asked)
			if ok {
				taken++
				due = time.Time{}
				continue
			}
			due = clk.t.Add(d)
			clk.t = due.Add(late) // every wake late
		}
		return taken
	}
	taken := run(15, 1, 30*time.Millisecond, false, true)
	require.GreaterOrEqual(t, taken, 149, "late wakes cost no tokens")
	require.LessOrEqual(t, taken, 151, "burst + rate x 10 s at most")
	require.Less(t, run(15, 1, 30*time.Millisecond, false, false), 110, "taken at the wake, late wakes cost tokens")
	require.Less(t, run(15, 1, 30*time.Millisecond, true, true), 110, "an edit at the wake leaves nothing to take as of before it")
	require.Equal(t, run(100, 5, 60*time.Millisecond, false, false), run(100, 5, 60*time.Millisecond, false, true),
		"a bucket five deep takes its token at the wake")
}

// TestDispatchPacerNeverCountsTimeTwice: tokens taken as of an earlier
// moment (late waiters), at once (the fast path) and around edits, in
// random order on a fake clock, never exceed burst + rate over the span:
// a token is never taken as of a moment before the limiter's last change.
func TestDispatchPacerNeverCountsTimeTwice(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	for range 500 {
		clk := newFakeClock()
		burst, r := 1+rng.IntN(8), 5+rng.Float64()*50
		p := newPacerAt(r, r, burst, clk.now)
		start, taken := clk.t, 0
		var dues [2]time.Time // two waiters (a scheduler and a batcher)
		for clk.t.Sub(start) < 5*time.Second {
			switch rng.IntN(4) {
			case 0:
				if p.tryToken() {
					taken++
				}
			case 1:
				p.configure(r, r, burst)
			default:
				due := &dues[rng.IntN(2)]
				ok, d := p.tokenAt(clk.t, *due)
				if ok {
					taken++
					*due = time.Time{}
				} else {
					*due = clk.t.Add(d)
				}
			}
			clk.t = clk.t.Add(time.Duration(rng.IntN(80)) * time.Millisecond)
		}
		bound := burst + int(r*clk.t.Sub(start).Seconds())
		require.LessOrEqual(t, taken, bound, "rate %.1f burst %d", r, burst)
	}
}
