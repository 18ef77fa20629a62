package dispatch

import (
	"context"
	"math"
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
	// recent holds the start times of the sends of the last second, oldest
	// first: see admit.
	recent []time.Time
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

// configure applies an account edit; a slowed account keeps its reduction
// but never exceeds the new ceiling.
func (p *pacer) configure(ceiling, floor float64, burst, recoverAfter int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// An account running at its old ceiling (never slowed, or fully
	// recovered) takes the new one at once; without this a raised
	// rate_per_sec only arrived by recovery steps, a tenth per RecoverAfter
	// successes.
	if p.current >= p.ceiling {
		p.current = ceiling
	}
	p.ceiling, p.floor, p.recoverAfter = ceiling, floor, recoverAfter
	p.current = min(max(p.current, floor), ceiling)
	p.limiter.SetLimit(rate.Limit(p.current))
	p.limiter.SetBurst(burst)
}

// wait blocks until the account may send: after any Retry-After pause, then
// for a token, then until the send fits in the last second (admit).
func (p *pacer) wait(ctx context.Context) error {
	if err := p.token(ctx); err != nil {
		return err
	}
	_, err := p.admit(ctx)
	return err
}

// token blocks until any Retry-After pause is over and a token is taken.
// The scheduler hands tokens out with it; each send then calls admit right
// before it starts, so the one-second bound holds at the moments sends
// start even when a granted job starts late.
func (p *pacer) token(ctx context.Context) error {
	for {
		p.mu.Lock()
		d := time.Until(p.pausedUntil)
		p.mu.Unlock()
		if d <= 0 {
			break
		}
		if err := sleep(ctx, d); err != nil {
			return err
		}
	}
	return p.limiter.Wait(ctx)
}

// tryToken takes a token if one is there now and the account is not
// paused, without waiting (the scheduler's fast path).
func (p *pacer) tryToken() bool {
	p.mu.Lock()
	paused := time.Now().Before(p.pausedUntil)
	p.mu.Unlock()
	return !paused && p.limiter.Allow()
}

// admit records a send starting now unless the last second already holds
// burst + ceil(rate) of them, in which case it waits until the oldest is a
// second old. The token bucket promises that bound only for the moments it
// hands out tokens: a sender that wakes late (GC, a busy CPU) then goes out
// together with the next one, and on a loaded host we measured 108-111
// sends in one second at 100/s burst 5. This makes the bound hold for the
// moments sends actually start. It returns the start it recorded, which
// the caller uses as its send's start time so both agree.
func (p *pacer) admit(ctx context.Context) (time.Time, error) {
	for {
		p.mu.Lock()
		now := time.Now()
		n := p.limiter.Burst() + int(math.Ceil(p.current))
		i := 0
		for i < len(p.recent) && now.Sub(p.recent[i]) >= admitWindow {
			i++
		}
		p.recent = p.recent[i:]
		if len(p.recent) < n {
			p.recent = append(p.recent, now)
			p.mu.Unlock()
			return now, nil
		}
		d := p.recent[len(p.recent)-n].Add(admitWindow).Sub(now)
		p.mu.Unlock()
		if err := sleep(ctx, d); err != nil {
			return time.Time{}, err
		}
	}
}

// admitWindow is the second admit keeps its bound over, plus a margin for
// the network: the provider counts requests as they arrive, and one that
// left late-ish and one that left a second later on a faster path arrive
// closer than a second apart (the gateway once counted 511 in a second at
// 500/s burst 10). It costs at most 2 % of the rate at full speed, and
// nothing when the burst is at least 2 % of the rate (rate + burst still
// fit into 1.02 s).
const admitWindow = time.Second + 20*time.Millisecond

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// drain empties the token bucket. A replica taking an account over calls it:
// its bucket filled up while it stood by, and the previous owner may have
// spent its own burst within the last second, so two bursts would break
// rate+burst across replicas.
func (p *pacer) drain() {
	now := time.Now()
	if n := int(p.limiter.TokensAt(now)); n > 0 {
		p.limiter.AllowN(now, n)
	}
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
