package shared

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// SignalsWatcher keeps a live view of KV broadcast_signals: each account's
// quality rating and messaging limit as the provider reports them.
type SignalsWatcher struct {
	view *KVView[*contract.AccountSignals]
}

// WatchSignals starts watching the signals; it returns once the current
// values are loaded. onChange, if not nil, is called with the account name
// after each later change.
func WatchSignals(ctx context.Context, js jetstream.JetStream, log *slog.Logger, onChange func(account string)) (*SignalsWatcher, error) {
	v, err := WatchKV(ctx, js, contract.BucketSignals, contract.DecodeAccountSignals, log, onChange)
	if err != nil {
		return nil, err
	}
	return &SignalsWatcher{view: v}, nil
}

// Get returns an account's signals, or nil when none are recorded.
func (sw *SignalsWatcher) Get(name string) *contract.AccountSignals {
	if sw == nil {
		return nil
	}
	s, _ := sw.view.Get(name)
	return s
}

// Accounts returns the accounts that have signals.
func (sw *SignalsWatcher) Accounts() []string { return sw.view.Keys() }

// PortfolioLimit is the messaging limit shared by the accounts of a
// portfolio (members: every account with that portfolio value): the one
// last reported for any of them (the provider reports the same for every
// number of a portfolio), else the lowest tier configured among them; 0
// means no limit.
func (sw *SignalsWatcher) PortfolioLimit(members []*contract.Account, tierCap func(*contract.Account) int) int {
	var latest *contract.AccountSignals
	for _, a := range members {
		if s := sw.Get(a.Name); s != nil && s.MessagingLimit != 0 && (latest == nil || s.At.After(latest.At)) {
			latest = s
		}
	}
	if latest != nil {
		return max(latest.MessagingLimit, 0) // unlimited: no limit
	}
	lowest := 0
	for _, a := range members {
		if c := tierCap(a); c > 0 && (lowest == 0 || c < lowest) {
			lowest = c
		}
	}
	return lowest
}
