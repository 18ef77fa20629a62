package dispatch

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// pacer is an account's token bucket at an adaptive rate (rateControl in
// adapt.go decides the rate from the answers), plus the provider's
// Retry-After: after a rate-limit answer that carries one, no send starts
// until it has passed, on any path (tokens, admit), and the bucket starts
// empty again afterwards, so the pause is not followed by a burst.
type pacer struct {
	limiter *rate.Limiter
	// now is the pacer's clock; the simulation replaces it.
	now func() time.Time

	mu          sync.Mutex
	ctl         rateControl
	pausedUntil time.Time
	// emptyOnResume is set while a pause's end has not yet emptied the bucket.
	emptyOnResume bool
	// reported is the rate changed last returned.
	reported float64
	// recent holds the start times of the sends of the last admitWindow,
	// oldest first: see admit.
	recent []time.Time
	// moved is the latest time the limiter was changed at (every change
	// goes through the pacer, under mu), before which no token may be
	// taken: the limiter would count the time since then twice.
	moved time.Time
}

func newPacer(ceiling, floor float64, burst int) *pacer {
	return newPacerAt(ceiling, floor, burst, time.Now)
}

// newPacerAt is newPacer on the clock now.
func newPacerAt(ceiling, floor float64, burst int, now func() time.Time) *pacer {
	// A new bucket starts full, whatever the clock says.
	return &pacer{limiter: rate.NewLimiter(rate.Limit(ceiling), burst), now: now, ctl: newRateControl(ceiling, floor)}
}

// configure applies an account edit: new ceiling, floor and burst. A
// slowed account keeps its reduction but never exceeds the new ceiling; one
// at its old ceiling takes the new one at once.
func (p *pacer) configure(ceiling, floor float64, burst int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.ctl.configure(ceiling, floor)
	p.limiter.SetLimitAt(now, rate.Limit(p.ctl.rate))
	p.limiter.SetBurstAt(now, burst)
	p.movedTo(now)
}

// wait blocks until the account may send: for a token, then until the send
// fits in the last admitWindow (admit), never during a Retry-After pause.
func (p *pacer) wait(ctx context.Context) error {
	if err := p.token(ctx); err != nil {
		return err
	}
	_, err := p.admit(ctx)
	return err
}

// token blocks until no Retry-After pause holds and a token is taken; when
// it has to wait, it waits for a few (grantBatchLocked). The scheduler
// hands tokens out with it; each send then calls admit right
// before it starts, so the one-second bound and the pause hold at the
// moments sends start even when a granted job starts late.
//
// A waiter for a full bucket (a burst of one) that wakes after the moment
// it waited for takes its token as of that moment, so the next token is
// due a token's time after it, not after the late wake: every wake the
// scheduler delayed (a busy CPU, the collector) was lost to the rate for
// good, and 1,000 accounts at 15/s each lost a tenth of it. A deeper
// bucket keeps filling while its waiter is late and loses nothing to a
// usual delay, so its token is taken at the wake: taken as of before, a
// long delay would let a token more out at once than the bucket holds,
// and the sends would run at the one-second bound, where arrival jitter
// makes a strict provider refuse. The starts stay bounded by admit, which
// counts them when they happen.
func (p *pacer) token(ctx context.Context) error {
	var due time.Time
	for {
		now := p.now()
		ok, d := p.tokenAt(now, due)
		if ok {
			return nil
		}
		due = now.Add(d)
		if err := sleep(ctx, d); err != nil {
			return err
		}
	}
}

// tryToken takes a token if one is there now and the account is not
// paused, without waiting (the scheduler's fast path).
func (p *pacer) tryToken() bool {
	ok, _ := p.tokenAt(p.now(), time.Time{})
	return ok
}

// tokenAt takes a token at now if the account is not paused and one is
// there; otherwise it says how long to wait before asking again. due, when
// set, is the earlier moment the caller waited for: a bucket one token
// deep gives its token as of then, or as of the limiter's last change if
// that came later (see token).
func (p *pacer) tokenAt(now, due time.Time) (bool, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.pausedLocked(now); d > 0 {
		return false, d
	}
	p.tickLocked(now)
	at := now
	if !due.IsZero() && due.Before(now) && p.limiter.Burst() <= p.grantBatchLocked() {
		at = due
		if at.Before(p.moved) {
			at = p.moved
		}
	}
	if p.limiter.AllowN(at, 1) {
		p.movedTo(at)
		return true, 0
	}
	if at != now && p.limiter.AllowN(now, 1) {
		p.movedTo(now)
		return true, 0
	}
	// The time until grantBatch tokens are there, at least a millisecond;
	// asked again then, so a pause or a rate change meanwhile applies.
	missing := float64(p.grantBatchLocked()) - p.limiter.TokensAt(now)
	d := time.Duration(missing / float64(p.limiter.Limit()) * float64(time.Second))
	return false, max(d, time.Millisecond)
}

// grantTick is how long a waiter for tokens lets them gather before it
// takes them (grantBatchLocked).
const grantTick = 10 * time.Millisecond

// grantBatchLocked is how many tokens a waiter lets gather before it takes
// one: a grantTick's worth at the current rate, at most half the burst (so
// a waiter that wakes a little late loses none to a full bucket), at least
// one. The tokens then leave together, one after the other without a
// wait, and their jobs' deliveries, event publishes and acks share system
// calls and wakeups in dispatch and in the server. Taken as each came
// (two or three a millisecond at 2,500/s), every job paid for its own,
// which made the paced cost per recipient twice the unpaced one
// (docs/performance.md, "Per process"). The rate is unchanged, and the
// bucket still bounds any span T to burst + rate*T starts; accounts
// slower than 200/s, or with a burst below 4, take one token at a time as
// before. Call with p.mu held.
func (p *pacer) grantBatchLocked() int {
	k := int(float64(p.limiter.Limit()) * grantTick.Seconds())
	return max(1, min(k, p.limiter.Burst()/2))
}

// pausedLocked returns how long the Retry-After pause still holds at now;
// at its end it empties the bucket (tokens that accrued during the pause
// would otherwise leave as a burst). Call with p.mu held.
func (p *pacer) pausedLocked(now time.Time) time.Duration {
	if d := p.pausedUntil.Sub(now); d > 0 {
		return d
	}
	if p.emptyOnResume {
		p.emptyOnResume = false
		p.emptyLocked(now)
	}
	return 0
}

// tickLocked lets the control law end its window at now. Call with p.mu
// held.
func (p *pacer) tickLocked(now time.Time) {
	if p.ctl.tick(now) {
		p.limiter.SetLimitAt(now, rate.Limit(p.ctl.rate))
		p.movedTo(now)
	}
}

// movedTo notes a change of the limiter at t. Call with p.mu held.
func (p *pacer) movedTo(t time.Time) {
	if t.After(p.moved) {
		p.moved = t
	}
}

// admit records a send starting now unless a Retry-After pause holds or the
// last admitWindow already holds burst + ceil(rate) starts, in which case
// it waits for the pause to end or for the oldest to leave the window. The
// token bucket promises that bound only for the moments it hands out
// tokens: a sender that wakes late (GC, a busy CPU) then goes out together
// with the next one, and on a loaded host we measured 108-111 sends in one
// second at 100/s burst 5. This makes the bound hold for the moments sends
// actually start, and it is where every send (granted job or batch call)
// checks the pause last: a job granted before a 429 arrived does not start
// during the pause. A send that waited out a pause takes a new token
// before it starts: its own is from before the pause, whose end emptied
// the bucket, and the sends the pause held would otherwise all start the
// moment it ends (two 0.3-2.8 ms apart, the second refused by a provider
// whose bucket is one deep, pausing the account again, a send a second:
// seed 841142931). It returns the start it recorded, which the caller
// uses as its send's start time so both agree.
func (p *pacer) admit(ctx context.Context) (time.Time, error) {
	for {
		now := p.now()
		ok, d, paused := p.admitAt(now)
		if ok {
			return now, nil
		}
		if err := sleep(ctx, d); err != nil {
			return time.Time{}, err
		}
		if paused {
			if err := p.token(ctx); err != nil {
				return time.Time{}, err
			}
		}
	}
}

// admitAt records a send starting at now if no pause holds and the window
// has room; otherwise it says how long to wait, and whether for a pause
// (the send then needs a new token: see admit).
func (p *pacer) admitAt(now time.Time) (ok bool, wait time.Duration, paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.pausedLocked(now); d > 0 {
		return false, d, true
	}
	n := p.limiter.Burst() + int(math.Ceil(p.ctl.rate))
	i := 0
	for i < len(p.recent) && now.Sub(p.recent[i]) >= admitWindow {
		i++
	}
	p.recent = p.recent[i:]
	if len(p.recent) < n {
		p.recent = append(p.recent, now)
		return true, 0, false
	}
	return false, p.recent[len(p.recent)-n].Add(admitWindow).Sub(now), false
}

// admitWindow is the second admit keeps its bound over, plus a margin for
// the network: the provider counts requests as they arrive, and one that
// left late-ish and one that left a second later on a faster path arrive
// closer than a second apart (the gateway once counted 511 in a second at
// 500/s burst 10). It costs at most 2 % of the rate at full speed, and
// nothing when the burst is at least 2 % of the rate (rate + burst still
// fit into 1.02 s).
const admitWindow = time.Second + 20*time.Millisecond

// sleepTimers holds stopped timers for sleep: an account paced below 200/s
// waits once per token, and a timer made for each wait (with its channel)
// was 3 % of the CPU of 1,000 accounts sending together. Since Go 1.23 a
// stopped or fired timer can be Reset with no stale value in its channel.
var sleepTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := sleepTimers.Get().(*time.Timer)
	t.Reset(d)
	defer func() {
		t.Stop()
		sleepTimers.Put(t)
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// empty takes every token out of the bucket. A replica taking an account
// over calls it: its bucket filled up while it stood by, and the previous
// owner may have spent its own burst within the last second, so two
// bursts would break rate+burst across replicas.
func (p *pacer) empty() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.emptyLocked(p.now())
}

func (p *pacer) emptyLocked(now time.Time) {
	if n := int(p.limiter.TokensAt(now)); n > 0 {
		p.limiter.AllowN(now, n)
		p.movedTo(now)
	}
}

// rateLimited notes a rate-limit answer: the account pauses for
// retryAfter (a longer pause already running is kept), and the answer
// counts towards the control law's window.
func (p *pacer) rateLimited(retryAfter time.Duration) { p.observe(true, retryAfter) }

// succeeded notes an answer that was not a rate limit.
func (p *pacer) succeeded() { p.observe(false, 0) }

func (p *pacer) observe(limited bool, retryAfter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if limited && retryAfter > 0 {
		if until := now.Add(retryAfter); until.After(p.pausedUntil) {
			p.pausedUntil, p.emptyOnResume = until, true
		}
	}
	if p.ctl.observe(now, limited, limited && retryAfter > 0) {
		p.limiter.SetLimitAt(now, rate.Limit(p.ctl.rate))
		p.movedTo(now)
	}
}

// changed returns the effective rate last returned by changed (the
// configured one at first) and the current one, when they differ: the
// rate changes at the end of a window, which may come with an answer or
// with a token asked for, so the account reports it with its next answer.
func (p *pacer) changed() (from, to float64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reported == 0 {
		p.reported = p.ctl.ceiling
	}
	if p.ctl.rate == p.reported {
		return 0, 0, false
	}
	from, p.reported = p.reported, p.ctl.rate
	return from, p.reported, true
}

// effective returns the current and configured rates.
func (p *pacer) effective() (current, ceiling float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctl.rate, p.ctl.ceiling
}
