package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// An account's health is what its answers say about it: whether it may
// send (not disabled, not paused), its adaptive rate, and its daily cap's
// use, published in KV broadcast_health for dashboards, render and the
// other replicas' choice of accounts. Account-fatal answers and repeated
// auth failures pause the account until its value is edited.

// mustNotSend reports whether the account must not send (disabled or
// paused) and why; its jobs then move to healthy accounts.
func (r *accountRunner) mustNotSend() (bool, string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.acct.IsEnabled() {
		return true, "account " + r.name + " is disabled"
	}
	if r.paused {
		return true, "account " + r.name + " is paused: " + r.pauseReason
	}
	return false, ""
}

// pause stops the account sending until its value is edited.
func (r *accountRunner) pause(reason string) {
	r.mu.Lock()
	if r.paused {
		r.mu.Unlock()
		return
	}
	r.paused, r.pauseReason, r.pausedSince = true, reason, time.Now().UTC()
	r.mu.Unlock()
	r.log.Error("ACCOUNT PAUSED: it sends nothing until its value in broadcast_accounts is edited; its jobs move to healthy accounts",
		"reason", reason)
	r.writeHealth(r.ctx)
}

// healthConfirm is how often an unchanged health value is written again
// while the account sends, so its updated_at says the sender is alive.
// Between, the periodic report writes only a value that changed: at a
// thousand busy accounts a write every HealthInterval each was 500 puts a
// second, each decoded by every watcher (render, dispatch, status).
const healthConfirm = 30 * time.Second

// healthNote is the value this runner last wrote (without updated_at) and
// when; its session's start clears it, so a new session writes at once.
type healthNote struct {
	mu      sync.Mutex
	written []byte
	at      time.Time
}

// shouldWrite reports whether value is to be written now: always unless
// onlyChanged, else when this runner did not write it in the last
// healthConfirm. A value to be written is noted as written now.
func (n *healthNote) shouldWrite(value []byte, now time.Time, onlyChanged bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if onlyChanged && bytes.Equal(value, n.written) && now.Sub(n.at) < healthConfirm {
		return false
	}
	n.written, n.at = value, now
	return true
}

// forget makes the next report write whatever it finds.
func (n *healthNote) forget() {
	n.mu.Lock()
	n.written = nil
	n.mu.Unlock()
}

// writeHealth publishes the account's health and effective rate.
func (r *accountRunner) writeHealth(ctx context.Context) {
	r.putHealth(ctx, false)
}

// putHealth builds the account's health and writes it; with onlyChanged,
// not when this runner wrote the same value less than healthConfirm ago.
func (r *accountRunner) putHealth(ctx context.Context, onlyChanged bool) {
	cur, ceiling := r.pacer.effective()
	now := time.Now()
	r.mu.RLock()
	acct := r.acct
	lim := r.svc.limitsOf(acct, now)
	h := contract.AccountHealth{State: contract.HealthHealthy, RatePerSec: cur, Ceiling: ceiling, DailyCap: lim.own,
		WarmupCap: lim.warmup, Portfolio: acct.Portfolio, PortfolioCap: lim.portfolio, UpdatedAt: now.UTC()}
	if acct.Warmup != nil {
		h.WarmupDay = acct.Warmup.Day(now)
	}
	if r.paused {
		h.State, h.Reason, h.Since = contract.HealthPaused, r.pauseReason, r.pausedSince
	}
	caps := r.caps
	r.mu.RUnlock()
	if sig := r.svc.signals.Get(r.name); sig != nil {
		h.Quality = sig.Quality
		if sig.HoldsMarketing() {
			h.MarketingHeld, h.QualityReason = true, "quality rating RED: marketing sends held, others at half rate"
		} else if sig.RateFactor() < 1 {
			h.QualityReason = "quality rating " + sig.Quality + ": rate ceiling halved"
		}
	}
	if caps != nil {
		h.DailyUsed = caps.used(now)
	}
	if acct.Portfolio != "" {
		h.PortfolioUsed = r.svc.portfolioUsed(acct.Portfolio, now)
	}
	stamp := h.UpdatedAt
	h.UpdatedAt = time.Time{}
	value, _ := json.Marshal(h)
	if !r.healthNote.shouldWrite(value, now, onlyChanged) {
		return
	}
	h.UpdatedAt = stamp
	data, _ := json.Marshal(h)
	if _, err := r.svc.healthKV.Put(ctx, r.name, data); err != nil {
		r.healthNote.forget() // written again at the next report
		if ctx.Err() == nil {
			r.log.Warn("could not write account health", "err", err)
		}
	}
}

// reportHealth refreshes the health value while this process is the
// account's active sender, so dashboards and render see its effective rate
// and remaining daily capacity: a value that changed at once, an unchanged
// one every healthConfirm. It runs for one session (run); its first
// report comes healthFirstReport into the session, then one every
// HealthInterval.
func (r *accountRunner) reportHealth(ctx context.Context) {
	every := r.svc.cfg.HealthInterval
	t := time.NewTimer(min(healthFirstReport, every))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(every)
		r.mu.RLock()
		active := time.Since(r.lastActive) < 3*every
		r.mu.RUnlock()
		if active {
			r.putHealth(ctx, true)
		}
	}
}

// healthFirstReport is when a session first reports its account's
// health: soon after its first sends, so a waking account's value is
// fresh within a fraction of HealthInterval.
const healthFirstReport = 250 * time.Millisecond

// maxAuthFailures is how many 401/403 answers in a row pause an account.
const maxAuthFailures = 3

// accountProblem reports whether an answer says the account cannot send
// (an account-fatal code of the channel, or HTTP 401/403: bad or revoked
// credentials) rather than anything about the recipient.
func accountProblem(res channels.Result) bool {
	return res.Class == contract.ClassAccountFatal || res.Code == "401" || res.Code == "403"
}

// noteSuccess counts an answer that was not a rate limit for adaptive
// pacing, and ends a run of auth failures.
func (r *accountRunner) noteSuccess() {
	r.mu.Lock()
	r.authFails = 0
	r.mu.Unlock()
	r.pacer.succeeded()
	r.noteRate(r.log)
}

// noteRate logs and publishes a change of the effective rate (pacer.go,
// adapt.go): a cut as a warning, a rise at debug level.
func (r *accountRunner) noteRate(log interface {
	Warn(string, ...any)
	Debug(string, ...any)
}) {
	from, to, ok := r.pacer.changed()
	if !ok {
		return
	}
	if to < from {
		log.Warn("provider refused beyond its noise; account slowed", "rate_from", from, "rate_to", to)
	} else {
		log.Debug("account rate raised", "rate_from", from, "rate_to", to)
	}
	r.writeHealth(r.ctx)
}

// noteFailure slows the account on rate limits and pauses it on
// account-fatal answers or repeated auth failures.
func (r *accountRunner) noteFailure(res channels.Result, log interface {
	Warn(string, ...any)
	Debug(string, ...any)
}) {
	switch res.Class {
	case contract.ClassRateLimited:
		r.pacer.rateLimited(res.RetryAfter)
		log.Debug("rate limited by provider", "retry_after", res.RetryAfter)
		r.noteRate(log)
		return
	case contract.ClassAccountFatal:
		r.pause(fmt.Sprintf("account-fatal answer (%s): %s", res.Code, res.Err))
		return
	}
	if res.Code == "401" || res.Code == "403" {
		// The failure that reaches the limit pauses: with several calls
		// in flight the next ones can be counted before its pause is set,
		// and a pause by one of them named 4 of 3 (TestDispatchPoolFailover
		// under the race detector).
		r.mu.Lock()
		r.authFails++
		reached := r.authFails == maxAuthFailures
		r.mu.Unlock()
		if reached {
			r.pause(fmt.Sprintf("%d auth failures in a row (last %s)", maxAuthFailures, res.Code))
		}
		r.pacer.succeeded() // not the provider saying "too fast"
		r.noteRate(log)
		return
	}
	r.mu.Lock()
	r.authFails = 0
	r.mu.Unlock()
	r.pacer.succeeded()
	r.noteRate(log)
}
