package dispatch

import (
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// dailyLimits are the caps on an account's distinct recipients per rolling
// 24 h, 0 meaning none. The account's own cap is the lowest of daily_cap,
// its warm-up ramp's cap for the day and the provider's messaging limit
// (the one reported in broadcast_signals, else the configured tier). An
// account in a portfolio leaves the provider's limit to the portfolio,
// whose accounts share one count.
type dailyLimits struct {
	own       int
	warmup    int
	provider  int
	portfolio int
}

// accountLimits computes an account's limits at now. portfolioLimit is the
// limit of its portfolio (ignored when it has none).
func accountLimits(acct *contract.Account, sig *contract.AccountSignals, portfolioLimit int, now time.Time) dailyLimits {
	l := dailyLimits{warmup: acct.Warmup.CapAt(now), provider: providerLimit(acct, sig)}
	l.own = lowestCap(acct.DailyCap, l.warmup)
	if acct.Portfolio == "" {
		l.own = lowestCap(l.own, l.provider)
	} else {
		l.portfolio = portfolioLimit
	}
	return l
}

// providerLimit is the provider's messaging limit for the account: the
// reported one when there is one, else its configured tier's.
func providerLimit(acct *contract.Account, sig *contract.AccountSignals) int {
	if sig != nil && sig.MessagingLimit != 0 {
		return max(sig.MessagingLimit, 0)
	}
	return channels.TierDailyCap(acct)
}

// lowestCap is the lower of two caps where 0 means none.
func lowestCap(a, b int) int {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// describeOwn names the cap that sets l.own, for a reason an operator
// reads: "warm-up cap 70 (day 1) reached on account wa1".
func (l dailyLimits) describeOwn(acct *contract.Account, now time.Time) string {
	switch {
	case l.own == l.warmup && l.warmup > 0:
		return fmt.Sprintf("warm-up cap %d (day %d) reached on account %s", l.own, acct.Warmup.Day(now), acct.Name)
	case l.own == acct.DailyCap:
		return fmt.Sprintf("daily_cap %d reached on account %s", l.own, acct.Name)
	default:
		return fmt.Sprintf("messaging limit %d reached on account %s", l.own, acct.Name)
	}
}
