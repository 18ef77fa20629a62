package client

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// AccountStatus is one sender account as `broadcast accounts` shows it:
// its configuration (KV broadcast_accounts, never its endpoint or secret
// name), its health as dispatch last wrote it (KV broadcast_health), the
// provider's quality rating (KV broadcast_signals) and its health score
// (KV broadcast_scores).
type AccountStatus struct {
	Name    string `json:"name"`
	Channel string `json:"channel"`
	Enabled bool   `json:"enabled"`
	// Invalid is why the account's value does not decode ("" when it does).
	Invalid string `json:"invalid,omitempty"`
	// State is "healthy" or "paused"; Reason why it is paused.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// RatePerSec is the effective (adaptive) rate, 0 before dispatch
	// reported; Ceiling the configured rate.
	RatePerSec float64    `json:"rate_per_sec"`
	Ceiling    float64    `json:"ceiling"`
	DailyUsed  int        `json:"daily_used"`
	DailyCap   int        `json:"daily_cap"`
	HealthAt   *time.Time `json:"health_at,omitempty"`
	// WarmupCap, Portfolio and its counts describe the caps beside
	// daily_cap; Quality and QualityReason the provider's rating and what
	// it does; Score the health score (-1 before status wrote one).
	WarmupCap     int    `json:"warmup_cap,omitempty"`
	Portfolio     string `json:"portfolio,omitempty"`
	PortfolioUsed int    `json:"portfolio_used,omitempty"`
	PortfolioCap  int    `json:"portfolio_cap,omitempty"`
	Quality       string `json:"quality"`
	QualityReason string `json:"quality_reason,omitempty"`
	Score         int    `json:"score"`
}

// Accounts returns every account with its health, by name.
func Accounts(ctx context.Context, js jetstream.JetStream) ([]AccountStatus, error) {
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	if err != nil {
		return nil, err
	}
	health, err := js.KeyValue(ctx, contract.BucketHealth)
	if err != nil {
		return nil, err
	}
	signals, err := js.KeyValue(ctx, contract.BucketSignals)
	if err != nil {
		return nil, err
	}
	scores, err := js.KeyValue(ctx, contract.BucketScores)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := []AccountStatus{}
	for name := range lister.Keys() {
		e, err := kv.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		s := AccountStatus{Name: name, State: contract.HealthHealthy, Quality: contract.QualityUnknown, Score: -1}
		if a, err := contract.DecodeAccount(name, e.Value()); err != nil {
			s.Invalid = err.Error()
		} else {
			s.Channel, s.Enabled, s.Ceiling, s.DailyCap = a.Channel, a.IsEnabled(), a.RatePerSec, a.DailyCap
		}
		if he, err := health.Get(ctx, name); err == nil {
			var h contract.AccountHealth
			if json.Unmarshal(he.Value(), &h) == nil {
				s.State, s.Reason, s.RatePerSec, s.DailyUsed = h.State, h.Reason, h.RatePerSec, h.DailyUsed
				if h.Ceiling > 0 {
					s.Ceiling = h.Ceiling
				}
				if h.DailyCap > 0 {
					s.DailyCap = h.DailyCap
				}
				s.WarmupCap, s.Portfolio, s.PortfolioUsed, s.PortfolioCap = h.WarmupCap, h.Portfolio, h.PortfolioUsed, h.PortfolioCap
				s.QualityReason = h.QualityReason
				at := h.UpdatedAt
				s.HealthAt = &at
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		if se, err := signals.Get(ctx, name); err == nil {
			if sig, err := contract.DecodeAccountSignals(se.Value()); err == nil {
				s.Quality = sig.QualityOrUnknown()
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		if sc, err := scores.Get(ctx, name); err == nil {
			var v contract.AccountScore
			if json.Unmarshal(sc.Value(), &v) == nil {
				s.Score = v.Score
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
