package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// ControlWatcher is a live view of KV broadcast_control.
type ControlWatcher struct {
	view *KVView[contract.Control]
}

// WatchControl starts following task run states; onChange (optional) is
// called with the task id of every later change.
func WatchControl(ctx context.Context, js jetstream.JetStream, log *slog.Logger, onChange func(taskID string)) (*ControlWatcher, error) {
	v, err := WatchKV(ctx, js, contract.BucketControl, func(b []byte) (contract.Control, error) {
		var c contract.Control
		err := json.Unmarshal(b, &c)
		return c, err
	}, log, onChange)
	if err != nil {
		return nil, err
	}
	return &ControlWatcher{view: v}, nil
}

// Read returns a task's control state as the bucket holds it now, and
// brings the view up to it. The view (Get) may lag behind a write made
// moments ago (its watch fell behind under load, or starts over after a
// server restart); a decision that must not act on a stale state reads.
func (w *ControlWatcher) Read(ctx context.Context, taskID string) (contract.Control, error) {
	c, _, err := w.view.Refresh(ctx, taskID)
	if err != nil {
		return contract.Control{}, fmt.Errorf("control state of %s: %w", taskID, err)
	}
	return c, nil
}

// Get returns a task's control state; a task without one is running.
func (w *ControlWatcher) Get(taskID string) contract.Control {
	c, _ := w.view.Get(taskID)
	return c
}

// PutControl records a task's run state.
func PutControl(ctx context.Context, kv jetstream.KeyValue, taskID string, c contract.Control) error {
	if c.At.IsZero() {
		c.At = time.Now().UTC()
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, taskID, data); err != nil {
		return fmt.Errorf("control state of %s: %w", taskID, err)
	}
	return nil
}
