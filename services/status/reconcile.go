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
	// One pass of a watcher reads every stored value in one ordered
	// consumer, not a request per key: the check holds up the fold, and a
	// month of finished tasks is tens of thousands of values.
	w, err := s.progress.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-w.Updates():
			if !ok {
				return errProgressWatchEnded
			}
			if u == nil {
				return nil // every value stored when the watch began was seen
			}
			e = u
		}
		if err := s.reconcileTask(ctx, p, e); err != nil {
			return err
		}
	}
}

var errProgressWatchEnded = errors.New("the watch of the progress values ended early")

// reconcileTask marks e's task dirty in p's folds when its stored progress
// e is unfinished and behind its fold state.
func (s *Service) reconcileTask(ctx context.Context, p *partition, e jetstream.KeyValueEntry) error {
	key := e.Key()
	if !contract.ValidID(key) || !p.owns(key) {
		return nil
	}
	var stored contract.Progress
	if json.Unmarshal(e.Value(), &stored) != nil || stored.State.Final() {
		return nil
	}
	s.mu.Lock()
	f := p.folds[key]
	dirty := f != nil && f.dirty
	s.mu.Unlock()
	if dirty {
		return nil // written at the next flush anyway
	}
	if f == nil {
		var err error
		if f, err = s.loadCheckpoint(ctx, key); err != nil || f == nil {
			return err
		}
	}
	if !ahead(&f.P, &stored) {
		return nil
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
	return nil
}

// ahead reports whether fold state a has more outcomes than progress b
// shows, or has finished where b has not.
func ahead(a, b *contract.Progress) bool {
	return a.Done() > b.Done() || a.State.Final() && !b.State.Final()
}
