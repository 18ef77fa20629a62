package shared

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// ControlWatcher is a live view of KV broadcast_control.
type ControlWatcher struct {
	view *KVView[contract.Control]
	kv   jetstream.KeyValue
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
	kv, err := js.KeyValue(ctx, contract.BucketControl)
	if err != nil {
		return nil, err
	}
	return &ControlWatcher{view: v, kv: kv}, nil
}

// Read returns a task's control state as the bucket holds it now. The view
// (Get) may lag behind a write made moments ago, most after a server
// restart, when its watch starts over; a decision that must not act on a
// stale state reads.
func (w *ControlWatcher) Read(ctx context.Context, taskID string) (contract.Control, error) {
	var c contract.Control
	e, err := w.kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("control state of %s: %w", taskID, err)
	}
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		return c, fmt.Errorf("control state of %s: %w", taskID, err)
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
