package dispatch

import (
	"time"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// Accounts with the same portfolio field share the provider's messaging
// limit (since October 2025 WhatsApp's limit belongs to the business
// portfolio): one rolling 24 h count of distinct recipients over all of
// them, kept in broadcast_sends under portfolioKey beside each account's
// own keys. A recipient any of them reached in the window takes no new
// slot. The count is exact within a replica; across replicas that own
// accounts of one portfolio, each sees the others' sends once they are
// recorded, so the limit can be passed by at most the sends to new
// recipients those replicas have under way at the moment it fills.

// portfolioMembers returns the accounts of a portfolio.
func (s *Service) portfolioMembers(portfolio string) []*contract.Account {
	var out []*contract.Account
	for _, a := range s.accounts.All() {
		if a.Portfolio == portfolio {
			out = append(out, a)
		}
	}
	return out
}

// limitsOf computes an account's daily limits now (limits.go).
func (s *Service) limitsOf(acct *contract.Account, now time.Time) dailyLimits {
	pl := 0
	if acct.Portfolio != "" {
		pl = s.signals.PortfolioLimit(s.portfolioMembers(acct.Portfolio), channels.TierDailyCap)
	}
	return accountLimits(acct, s.signals.Get(acct.Name), pl, now)
}

// portfolioTracker returns the shared count of a portfolio, starting it on
// first use.
func (s *Service) portfolioTracker(portfolio string) (*capTracker, error) {
	s.portfolioMu.Lock()
	defer s.portfolioMu.Unlock()
	if c := s.portfolioCaps[portfolio]; c != nil {
		return c, nil
	}
	c, err := newCapTracker(s.ctx, s.sends, portfolioKey(portfolio), s.log.With("portfolio", portfolio))
	if err != nil {
		return nil, err
	}
	s.portfolioCaps[portfolio] = c
	return c, nil
}

// portfolioUsed is a portfolio's count now, 0 when no tracker runs here.
func (s *Service) portfolioUsed(portfolio string, now time.Time) int {
	s.portfolioMu.Lock()
	c := s.portfolioCaps[portfolio]
	s.portfolioMu.Unlock()
	if c == nil {
		return 0
	}
	return c.used(now)
}
