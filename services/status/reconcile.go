package status

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// A progress write the server acknowledged can still be lost: nats-server
// killed before its write cache reached the file (JetStream writes to disk
// on its own schedule, not on each store), after the checkpoint before it
// was written. The events behind that progress are acknowledged, so no
// fold marks the task dirty again, and progress would stay behind its
// checkpoint for good (scenario seed 840142194: EVENTS and the checkpoint
// at 90 sent and 2 failed of 92, progress at 88 sent, 1 failed, 2
// retrying). So whenever this process begins to hold a partition's fold,
// and whenever its connection comes back, it compares the partition's
// unfinished progress values with their tasks' checkpoints and writes
// again those the checkpoint is ahead of, never back: progress only moves
// forward.

// reconcile marks dirty, in p's folds, every task of p whose progress in
// KV is unfinished and behind its fold state (the one in memory, else the
// checkpoint), so the next flush writes it. It runs in p's fold loop; an
// error says it could not look at every task (try again later).
func (s *Service) reconcile(ctx context.Context, p *partition) error {
	keys, err := s.progress.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = keys.Stop() }()
	for key := range keys.Keys() {
		if !contract.ValidID(key) || !p.owns(key) {
			continue
		}
		e, err := s.progress.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		var stored contract.Progress
		if json.Unmarshal(e.Value(), &stored) != nil || stored.State.Final() {
			continue
		}
		s.mu.Lock()
		f := p.folds[key]
		dirty := f != nil && f.dirty
		s.mu.Unlock()
		if dirty {
			continue // written at the next flush anyway
		}
		if f == nil {
			if f, err = s.loadCheckpoint(ctx, key); err != nil {
				return err
			}
			if f == nil {
				continue
			}
		}
		if !ahead(&f.P, &stored) {
			continue
		}
		s.mu.Lock()
		if p.folds[key] == nil {
			f.breaker.reset(s.cfg.CircuitWindow)
			p.folds[key] = f
		}
		p.folds[key].dirty = true
		s.mu.Unlock()
		s.log.Info("progress was behind the task's fold state; writing it again", shared.KeyTaskID, key,
			"stored_sent", stored.Sent, "sent", f.P.Sent, "state", f.P.State)
	}
	return ctx.Err()
}

// ahead reports whether fold state a has more outcomes than progress b
// shows, or has finished where b has not.
func ahead(a, b *contract.Progress) bool {
	return a.Done() > b.Done() || a.State.Final() && !b.State.Final()
}
