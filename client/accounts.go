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
// name) and its health as dispatch last wrote it (KV broadcast_health).
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
		s := AccountStatus{Name: name, State: contract.HealthHealthy}
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
				at := h.UpdatedAt
				s.HealthAt = &at
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
