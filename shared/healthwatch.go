package shared

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// HealthWatcher keeps a live view of KV broadcast_health.
type HealthWatcher struct {
	view *KVView[*contract.AccountHealth]
}

// WatchHealth starts watching account health; it returns once the current
// values are loaded.
func WatchHealth(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*HealthWatcher, error) {
	v, err := WatchKV(ctx, js, contract.BucketHealth, func(b []byte) (*contract.AccountHealth, error) {
		var h contract.AccountHealth
		err := json.Unmarshal(b, &h)
		return &h, err
	}, log, nil)
	if err != nil {
		return nil, err
	}
	return &HealthWatcher{view: v}, nil
}

// Get returns an account's health, or nil when none is recorded (healthy).
func (hw *HealthWatcher) Get(name string) *contract.AccountHealth {
	if hw == nil {
		return nil
	}
	h, _ := hw.view.Get(name)
	return h
}

// Usable filters accounts down to the healthy ones.
func (hw *HealthWatcher) Usable(accounts []*contract.Account) []*contract.Account {
	out := accounts[:0:0]
	for _, a := range accounts {
		if hw.Get(a.Name).Healthy() {
			out = append(out, a)
		}
	}
	return out
}
