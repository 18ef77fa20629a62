package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
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
type HealthWatcher struct {
	mu     sync.RWMutex
	health map[string]*AccountHealth
}

// WatchHealth starts watching account health; it returns once the current
// values are loaded.
func WatchHealth(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*HealthWatcher, error) {
	kv, err := js.KeyValue(ctx, BucketHealth)
	if err != nil {
		return nil, fmt.Errorf("health bucket: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch health: %w", err)
	}
	hw := &HealthWatcher{health: map[string]*AccountHealth{}}
	ready := make(chan struct{})
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if initial {
						close(ready)
						initial = false
					}
					continue
				}
				hw.mu.Lock()
				if e.Operation() != jetstream.KeyValuePut {
					delete(hw.health, e.Key())
				} else {
					var h AccountHealth
					if err := json.Unmarshal(e.Value(), &h); err != nil {
						log.Warn("bad health value", KeyAccount, e.Key(), "err", err)
					} else {
						hw.health[e.Key()] = &h
					}
				}
				hw.mu.Unlock()
			}
		}
	}()
	select {
	case <-ready:
		return hw, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Get returns an account's health, or nil when none is recorded (healthy).
func (hw *HealthWatcher) Get(name string) *AccountHealth {
	if hw == nil {
		return nil
	}
	hw.mu.RLock()
	defer hw.mu.RUnlock()
	return hw.health[name]
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
