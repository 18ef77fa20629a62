package status

import (
	"context"
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
// A flush saves a task's checkpoint before it writes the task's progress,
// so a checkpoint stored after the task's progress value is the trace of
// such a loss. Whenever this process begins to hold a partition's fold,
// and whenever its connection comes back, it compares the two stores'
// times (server times: a checkpoint's modification, a value's creation)
// and writes again, from the newer state, every task of the partition
// whose checkpoint is the newer or whose progress is missing. Comparing
// times rather than counts never writes progress back, and holds for a
// finished task reopened by retry-dead, whose counts go down and up.

// reconcile marks dirty, in p's folds, every task of p whose checkpoint was
// saved after its progress value was written, so the next flush writes it.
// It runs in p's fold loop; an error says it could not look at every task
// (try again later).
func (s *Service) reconcile(ctx context.Context, p *partition) error {
	// The two reads are passes of one watcher each, over streams of tens of
	// thousands of entries after a month of tasks; they run side by side,
	// as the check holds up the fold.
	var written map[string]time.Time
	var writtenErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		written, writtenErr = s.progressTimes(ctx, p)
	}()
	saved, err := s.checkpointTimes(ctx, p)
	<-done
	if err != nil {
		return err
	}
	if writtenErr != nil {
		return writtenErr
	}
	for id, at := range saved {
		if w, ok := written[id]; ok && !at.After(w) {
			continue
		}
		if err := s.reconcileTask(ctx, p, id); err != nil {
			return err
		}
	}
	return nil
}

// checkpointTimes returns when each of p's tasks' checkpoints was last
// saved, from one pass over the checkpoints' descriptions (not their
// contents).
func (s *Service) checkpointTimes(ctx context.Context, p *partition) (map[string]time.Time, error) {
	w, err := s.checkpoints.Watch(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	saved := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case info, ok := <-w.Updates():
			if !ok {
				return nil, errWatchEnded
			}
			if info == nil {
				return saved, nil // every checkpoint stored when the watch began was seen
			}
			if !info.Deleted && contract.ValidID(info.Name) && p.owns(info.Name) {
				saved[info.Name] = info.ModTime
			}
		}
	}
}

// progressTimes returns when each of p's tasks' progress value was last
// written.
func (s *Service) progressTimes(ctx context.Context, p *partition) (map[string]time.Time, error) {
	w, err := s.progress.WatchAll(ctx, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	written := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errWatchEnded
			}
			if e == nil {
				return written, nil // every value stored when the watch began was seen
			}
			if p.owns(e.Key()) {
				written[e.Key()] = e.Created()
			}
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
