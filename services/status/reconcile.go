package status

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// A progress write can be lost after its checkpoint was saved: the status
// process killed between the two writes of a flush, or nats-server killed
// before its write cache reached the file (JetStream writes to disk on its
// own schedule, not on each store). The events behind it are acknowledged,
// so no fold marks the task dirty again, and progress would stay behind
// its checkpoint for good (scenario seed 840142194: EVENTS and the
// checkpoint at 90 sent of 92, progress at 88 sent and 2 retrying; in
// another run a task reopened by retry-dead, whose re-queued recipient
// was then sent, kept a finished progress with 89 sent of 90).
//
// A flush saves a task's checkpoint, with the updated_at of the progress
// it is about to write in the checkpoint's metadata, and then writes that
// progress. So a checkpoint naming a later updated_at than the stored
// progress's is the trace of such a loss; one naming the same or an earlier
// one is not (later flushes write progress alone). Whenever this process
// begins to hold a partition's fold, and whenever its connection comes
// back, it compares the two and writes again, from the checkpoint's
// state, every task of the partition whose last write was lost or whose
// progress is missing. Comparing times rather than counts never writes
// progress back, and holds for a finished task reopened by retry-dead,
// whose counts go down and up. Both times are taken by status at its
// flushes, in one process or across a take-over seconds apart, so clocks
// a few milliseconds apart do not turn every task into one behind (the
// servers' times of two streams could). A checkpoint saved
// by an earlier version, without the metadata, is compared by the
// server's times instead (its modification against the value's creation).

// reconcile marks dirty, in p's folds, every task of p whose last progress
// write was lost, so the next flush writes it. It runs in p's fold loop;
// an error says it could not look at every task (try again later).
func (s *Service) reconcile(ctx context.Context, p *partition) error {
	// The two reads are passes of one watcher each, over streams of tens of
	// thousands of entries after a month of tasks; they run side by side,
	// as the check holds up the fold.
	var written map[string]progressMark
	var writtenErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		written, writtenErr = s.progressMarks(ctx, p)
	}()
	saved, err := s.checkpointMarks(ctx, p)
	<-done
	if err != nil {
		return err
	}
	if writtenErr != nil {
		return writtenErr
	}
	for id, cp := range saved {
		if w, ok := written[id]; ok && !cp.lostWrite(w) {
			continue
		}
		if err := s.reconcileTask(ctx, p, id); err != nil {
			return err
		}
	}
	return nil
}

// checkpointMark is what a checkpoint's description says of it.
type checkpointMark struct {
	progressAt time.Time // the updated_at it was saved with; zero if not noted
	saved      time.Time // when the server stored it
}

// progressMark is what reconcile reads of a stored progress value.
type progressMark struct {
	updatedAt time.Time // its updated_at
	written   time.Time // when the server stored it
}

// lostWrite reports whether the progress written after checkpoint c is
// missing: w is older.
func (c checkpointMark) lostWrite(w progressMark) bool {
	if !c.progressAt.IsZero() {
		return c.progressAt.After(w.updatedAt)
	}
	return c.saved.After(w.written)
}

// checkpointMarks reads the descriptions of p's tasks' checkpoints (not
// their contents) in one pass.
func (s *Service) checkpointMarks(ctx context.Context, p *partition) (map[string]checkpointMark, error) {
	w, err := s.checkpoints.Watch(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	saved := map[string]checkpointMark{}
	err = readStored(ctx, w.Updates(), func(info *jetstream.ObjectInfo) {
		if info.Deleted || !contract.ValidID(info.Name) || !p.owns(info.Name) {
			return
		}
		m := checkpointMark{saved: info.ModTime}
		if at, err := time.Parse(time.RFC3339Nano, info.Metadata[checkpointProgressAt]); err == nil {
			m.progressAt = at
		}
		saved[info.Name] = m
	})
	return saved, err
}

// progressMarks reads p's tasks' stored progress values in one pass.
func (s *Service) progressMarks(ctx context.Context, p *partition) (map[string]progressMark, error) {
	w, err := s.progress.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	written := map[string]progressMark{}
	err = readStored(ctx, w.Updates(), func(e jetstream.KeyValueEntry) {
		if !p.owns(e.Key()) {
			return
		}
		var stored struct {
			UpdatedAt time.Time `json:"updated_at"`
		}
		_ = json.Unmarshal(e.Value(), &stored) // unreadable: zero, so behind any checkpoint
		written[e.Key()] = progressMark{updatedAt: stored.UpdatedAt, written: e.Created()}
	})
	return written, err
}

// readStored hands each of a watcher's updates to each until the nil that
// follows the values stored when the watch began.
func readStored[T comparable](ctx context.Context, updates <-chan T, each func(T)) error {
	var end T
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-updates:
			if !ok {
				return errWatchEnded
			}
			if u == end {
				return nil
			}
			each(u)
		}
	}
}

var errWatchEnded = errors.New("a watch ended before it saw every stored value")

// reconcileTask marks taskID dirty in p's folds, from its fold state in
// memory or else its checkpoint.
func (s *Service) reconcileTask(ctx context.Context, p *partition, taskID string) error {
	s.mu.Lock()
	f := p.folds[taskID]
	dirty := f != nil && f.dirty
	s.mu.Unlock()
	if dirty {
		return nil // written at the next flush anyway
	}
	if f == nil {
		var err error
		if f, err = s.loadCheckpoint(ctx, taskID); err != nil || f == nil {
			return err
		}
	}
	s.mu.Lock()
	if p.folds[taskID] == nil {
		f.breaker.reset(s.cfg.CircuitWindow)
		p.folds[taskID] = f
	}
	p.folds[taskID].dirty = true
	s.mu.Unlock()
	s.log.Info("the task's last progress write was lost; writing it again", shared.KeyTaskID, taskID,
		"sent", f.P.Sent, "state", f.P.State)
	return nil
}
