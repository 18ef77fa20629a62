package dispatch

import (
	"context"

	"github.com/broadcastd/broadcast/contract"
)

// What the provider says about an account's quality (KV broadcast_signals,
// written by feedback from WhatsApp's account webhooks or by an operator)
// steers it: YELLOW or RED halves its rate ceiling until the rating
// recovers, and RED holds its marketing sends, which move to an account of
// their pool whose rating does not hold them, or wait (code quality_red)
// until one does. Utility and transactional sends go on at the halved rate.
// A changed messaging limit changes the account's daily cap (limits.go).

// maySendCategory reports whether an account's quality lets it send jobs
// of category c.
func (s *Service) maySendCategory(account string, c contract.Category) bool {
	return c != contract.CategoryMarketing || !s.signals.Get(account).HoldsMarketing()
}

// configurePacer applies the account's rate fields scaled by its quality.
func (r *accountRunner) configurePacer(a *contract.Account) {
	f := r.svc.signals.Get(a.Name).RateFactor()
	r.pacer.configure(a.RatePerSec*f, min(a.MinRatePerSec, a.RatePerSec*f), a.Burst)
}

// heldByQuality reports whether the job must not go through this account
// now: a marketing job on an account whose quality is RED.
func (r *accountRunner) heldByQuality(d *delivery) (bool, string) {
	if r.svc.maySendCategory(r.name, d.job.JobCategory()) {
		return false, ""
	}
	return true, "account " + r.name + " has quality rating RED: its marketing sends are held"
}

// signalsChanged applies a change of an account's signals: its pacing and
// health, and, when capacity may have come back (a better rating, a raised
// limit), a wake of the held jobs of its channel.
func (s *Service) signalsChanged(account string) {
	s.mu.Lock()
	r := s.runners[account]
	s.mu.Unlock()
	if r == nil {
		return
	}
	acct, _ := r.current()
	r.configurePacer(acct)
	if sig := s.signals.Get(account); sig != nil {
		r.log.Info("provider signals changed", "quality", sig.Quality, "messaging_limit", sig.MessagingLimit,
			"event", sig.Event, "rate_factor", sig.RateFactor())
	}
	r.writeHealth(context.WithoutCancel(r.ctx))
	s.wakeLater(acct.Channel)
}
