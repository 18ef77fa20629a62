package dispatch

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// pacer is an account's token bucket with adaptive rate (AIMD): a
// rate-limit answer halves the effective rate at once, down to a floor, and
// pauses the account for the provider's Retry-After; every RecoverAfter
// successes in a row add a tenth of the ceiling back, never above it.
type pacer struct {
	limiter *rate.Limiter

	mu           sync.Mutex
	ceiling      float64
	floor        float64
	current      float64
	recoverAfter int
	successes    int
	pausedUntil  time.Time
	// cooldownUntil ends the window in which further rate-limit answers
	// belong to the same overload (requests that were already in flight),
	// so they do not halve the rate again.
	cooldownUntil time.Time
}

func newPacer(ceiling, floor float64, burst, recoverAfter int) *pacer {
	return &pacer{
		limiter:      rate.NewLimiter(rate.Limit(ceiling), burst),
		ceiling:      ceiling,
		floor:        floor,
		current:      ceiling,
		recoverAfter: recoverAfter,
	}
}

// configure applies an account edit; the effective rate keeps its
// reduction but never exceeds the new ceiling.
func (p *pacer) configure(ceiling, floor float64, burst, recoverAfter int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ceiling, p.floor, p.recoverAfter = ceiling, floor, recoverAfter
	p.current = min(max(p.current, floor), ceiling)
	p.limiter.SetLimit(rate.Limit(p.current))
	p.limiter.SetBurst(burst)
}

// wait blocks until the account may send: after any Retry-After pause, then
// for a token.
func (p *pacer) wait(ctx context.Context) error {
	for {
		p.mu.Lock()
		d := time.Until(p.pausedUntil)
		p.mu.Unlock()
		if d <= 0 {
			break
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return p.limiter.Wait(ctx)
}

// rateLimited slows the account and returns the old and new effective rate.
// The first rate-limit answer halves the rate and pauses the account for
// Retry-After; answers within the following cooldown (twice Retry-After, at
// least two seconds: the pause plus as long again of sending at the lower
// rate) come from the same overload and change nothing.
func (p *pacer) rateLimited(retryAfter time.Duration) (from, to float64, slowed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Before(p.cooldownUntil) {
		return p.current, p.current, false
	}
	from = p.current
	p.current = max(p.current/2, p.floor)
	p.limiter.SetLimit(rate.Limit(p.current))
	p.successes = 0
	p.cooldownUntil = now.Add(max(2*retryAfter, 2*time.Second))
	if retryAfter > 0 {
		p.pausedUntil = now.Add(retryAfter)
	}
	return from, p.current, true
}

// succeeded counts a success; it returns changed=true when the rate stepped up.
func (p *pacer) succeeded() (changed bool, from, to float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.current >= p.ceiling {
		return false, p.current, p.current
	}
	p.successes++
	if p.successes < p.recoverAfter {
		return false, p.current, p.current
	}
	p.successes = 0
	from = p.current
	p.current = min(p.current+p.ceiling/10, p.ceiling)
	p.limiter.SetLimit(rate.Limit(p.current))
	return true, from, p.current
}

// effective returns the current and configured rates.
func (p *pacer) effective() (current, ceiling float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.current, p.ceiling
}
