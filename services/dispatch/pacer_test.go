package dispatch

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// endCooldown makes the next rate-limit answer count as a new overload.
func endCooldown(p *pacer) {
	p.mu.Lock()
	p.cooldownUntil = time.Time{}
	p.mu.Unlock()
}

func limit(p *pacer) float64 { return float64(p.limiter.Limit()) }

func TestDispatchPacerHalvesOnRateLimit(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	from, to, slowed := p.rateLimited(0)
	require.True(t, slowed)
	require.Equal(t, 60.0, from)
	require.Equal(t, 30.0, to)
	cur, ceiling := p.effective()
	require.Equal(t, 30.0, cur)
	require.Equal(t, 60.0, ceiling)
	require.Equal(t, 30.0, limit(p), "the token bucket runs at the effective rate")
}

func TestDispatchPacerCooldownIgnoresSameOverload(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	p.rateLimited(time.Second)
	// Answers to requests already in flight come within the cooldown.
	for range 5 {
		_, to, slowed := p.rateLimited(time.Second)
		require.False(t, slowed)
		require.Equal(t, 30.0, to)
	}
	endCooldown(p)
	_, to, slowed := p.rateLimited(time.Second)
	require.True(t, slowed, "a rate-limit answer after the cooldown is a new overload")
	require.Equal(t, 15.0, to)
}

func TestDispatchPacerCooldownLength(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		retryAfter, want time.Duration
	}{{0, 2 * time.Second}, {500 * time.Millisecond, 2 * time.Second}, {3 * time.Second, 6 * time.Second}} {
		p := newPacer(60, 3, 5, 10)
		before := time.Now()
		p.rateLimited(c.retryAfter)
		p.mu.Lock()
		got := p.cooldownUntil.Sub(before)
		p.mu.Unlock()
		require.InDelta(t, c.want.Seconds(), got.Seconds(), 0.05, "retry after %s", c.retryAfter)
	}
}

func TestDispatchPacerFloor(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	var rates []float64
	for range 10 {
		endCooldown(p)
		_, to, _ := p.rateLimited(0)
		rates = append(rates, to)
	}
	t.Logf("rates after successive overloads: %v", rates)
	require.Equal(t, []float64{30, 15, 7.5, 3.75, 3, 3, 3, 3, 3, 3}, rates)
	require.Equal(t, 3.0, limit(p))
}

func TestDispatchPacerRecoveryNeverAboveCeiling(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	p.rateLimited(0)
	p.rateLimited(0) // in the cooldown: no change
	endCooldown(p)
	p.rateLimited(0) // 15
	var steps []float64
	for i := 1; i <= 200; i++ {
		changed, from, to := p.succeeded()
		if changed {
			require.Zero(t, i%10, "the rate steps up only after recover_after successes in a row")
			require.Equal(t, min(from+6, 60), to, "each step adds a tenth of the ceiling")
			steps = append(steps, to)
		}
		cur, _ := p.effective()
		require.LessOrEqual(t, cur, 60.0)
		require.Equal(t, cur, limit(p))
	}
	t.Logf("recovery steps from 15/s: %v", steps)
	require.Equal(t, []float64{21, 27, 33, 39, 45, 51, 57, 60}, steps)
	changed, _, _ := p.succeeded()
	require.False(t, changed, "at the ceiling successes change nothing")
}

func TestDispatchPacerRateLimitResetsSuccessRun(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	p.rateLimited(0)
	for range 9 {
		p.succeeded()
	}
	endCooldown(p)
	p.rateLimited(0) // 15, and the run of 9 successes is forgotten
	for range 9 {
		changed, _, _ := p.succeeded()
		require.False(t, changed)
	}
	changed, from, to := p.succeeded()
	require.True(t, changed)
	require.Equal(t, 15.0, from)
	require.Equal(t, 21.0, to)
}

func TestDispatchPacerConfigure(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	p.rateLimited(0) // 30

	// A higher ceiling keeps the reduction; recovery then climbs to it.
	p.configure(100, 3, 5, 10)
	cur, ceiling := p.effective()
	require.Equal(t, 30.0, cur)
	require.Equal(t, 100.0, ceiling)
	require.Equal(t, 30.0, limit(p))

	// A lower ceiling caps the effective rate at once.
	p.configure(20, 2, 4, 10)
	cur, ceiling = p.effective()
	require.Equal(t, 20.0, cur)
	require.Equal(t, 20.0, ceiling)
	require.Equal(t, 20.0, limit(p))
	require.Equal(t, 4, p.limiter.Burst())

	// A floor above the effective rate lifts it.
	endCooldown(p)
	p.rateLimited(0) // 10
	p.configure(20, 15, 4, 10)
	cur, _ = p.effective()
	require.Equal(t, 15.0, cur)
	require.Equal(t, rate.Limit(15), p.limiter.Limit())

	// recover_after applies to the next run.
	p.configure(20, 15, 4, 3)
	for range 2 {
		changed, _, _ := p.succeeded()
		require.False(t, changed)
	}
	changed, _, to := p.succeeded()
	require.True(t, changed)
	require.Equal(t, 17.0, to)
}

func TestDispatchPacerConfigureUnreducedTakesNewCeiling(t *testing.T) {
	t.Parallel()
	p := newPacer(60, 3, 5, 10)
	p.configure(100, 5, 5, 10)
	cur, _ := p.effective()
	require.Equal(t, 100.0, cur, "an account that was never slowed runs at its new rate at once")
	require.Equal(t, 100.0, limit(p))
}

func TestDispatchPacerHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	p := newPacer(1000, 10, 10, 10)
	p.rateLimited(300 * time.Millisecond)
	start := time.Now()
	require.NoError(t, p.wait(context.Background()))
	waited := time.Since(start)
	t.Logf("waited %s for a Retry-After of 300ms", waited.Round(time.Millisecond))
	require.GreaterOrEqual(t, waited, 290*time.Millisecond)
	require.Less(t, waited, time.Second)

	// A cancelled wait returns at once with the context's error.
	p.rateLimited(0)
	endCooldown(p)
	p.rateLimited(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.wait(ctx), context.DeadlineExceeded)
}

func TestDispatchPacerPaces(t *testing.T) {
	t.Parallel()
	const r, burst, n = 200.0, 5, 105
	p := newPacer(r, 10, burst, 10)
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

func TestDispatchPacerDrain(t *testing.T) {
	t.Parallel()
	const r, burst = 100.0, 5
	p := newPacer(r, 10, burst, 10)
	p.drain()
	start := time.Now()
	for range burst {
		require.NoError(t, p.wait(context.Background()))
	}
	elapsed := time.Since(start)
	t.Logf("%d waits after a drain at %v/s took %s", burst, r, elapsed.Round(time.Millisecond))
	require.GreaterOrEqual(t, elapsed, 45*time.Millisecond, "a drained bucket has no burst: one token per 10ms")

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
	p := newPacer(5, 1, 5, 10) // at most 10 starts in any second
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
