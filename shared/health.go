package shared

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Account health states.
const (
	HealthHealthy = "healthy"
	// HealthPaused: the account answered with an account-fatal error (or
	// repeated auth failures). It sends nothing until its account value is
	// edited; its queued jobs move to healthy accounts of the channel.
	HealthPaused = "paused"
)

// AccountHealth is kept in KV broadcast_health under the account name by
// the dispatch process that owns the account.
type AccountHealth struct {
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	// RatePerSec is the effective (adaptive) rate; Ceiling the configured one.
	RatePerSec float64 `json:"rate_per_sec"`
	Ceiling    float64 `json:"ceiling"`
	// DailyUsed and DailyCap describe the rolling 24 h window.
	DailyUsed int       `json:"daily_used"`
	DailyCap  int       `json:"daily_cap"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Healthy reports whether the account may receive work.
func (h *AccountHealth) Healthy() bool { return h == nil || h.State != HealthPaused }

// Remaining is how many new recipients the account can still take in the
// rolling window, or -1 when it has no cap.
func (h *AccountHealth) Remaining() int {
	if h == nil || h.DailyCap <= 0 {
		return -1
	}
	return max(h.DailyCap-h.DailyUsed, 0)
}

// HealthWatcher keeps a live view of KV broadcast_health.
type HealthWatcher struct{ view *KVView[*AccountHealth] }

// WatchHealth starts watching account health; it returns once the current
// values are loaded.
func WatchHealth(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*HealthWatcher, error) {
	v, err := WatchKV(ctx, js, BucketHealth, func(b []byte) (*AccountHealth, error) {
		var h AccountHealth
		err := json.Unmarshal(b, &h)
		return &h, err
	}, log, nil)
	if err != nil {
		return nil, err
	}
	return &HealthWatcher{view: v}, nil
}

// Get returns an account's health, or nil when none is recorded (healthy).
func (hw *HealthWatcher) Get(name string) *AccountHealth {
	if hw == nil {
		return nil
	}
	h, _ := hw.view.Get(name)
	return h
}

// Usable filters accounts down to the healthy ones.
func (hw *HealthWatcher) Usable(accounts []*Account) []*Account {
	out := accounts[:0:0]
	for _, a := range accounts {
		if hw.Get(a.Name).Healthy() {
			out = append(out, a)
		}
	}
	return out
}
