package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// keepAlive writes the records of live tasks again before the buckets'
// TTL drops them, until ctx ends. A paused task's run state expiring would
// let its parked jobs go (the sweeper reads an empty state as running), and
// a task waiting on a daily cap for weeks still needs its record. A task
// awaiting approval past approvalWindow is cancelled with the reason: its
// submission, which the release reads, leaves the TASKS stream with the
// same retention.
func (s *Service) keepAlive(ctx context.Context) {
	st, err := s.tasks.Status(ctx)
	if err != nil || st.TTL() <= 0 {
		return // no TTL: nothing expires
	}
	ttl := st.TTL()
	every := s.cfg.KeepAliveEvery
	if every == 0 {
		every = ttl / 4
	}
	shared.Every(ctx, every, func(ctx context.Context) {
		n, err := s.refreshLive(ctx, ttl, every)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("keeping live task records alive failed; next round tries again", "err", err)
		}
		if n > 0 {
			s.log.Debug("live task records kept alive", "count", n)
		}
	})
}

// refreshLive rewrites every record of a live task older than every (so
// each is rewritten at least once per TTL/2 at the default), and its run
// state; it returns how many tasks it kept.
func (s *Service) refreshLive(ctx context.Context, ttl, every time.Duration) (int, error) {
	keys, err := s.tasks.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = keys.Stop() }()
	n := 0
	for id := range keys.Keys() {
		e, err := s.tasks.Get(ctx, id)
		if err != nil {
			continue // gone meanwhile
		}
		if time.Since(e.Created()) < every {
			continue
		}
		final, state := s.isFinal(ctx, id)
		if final {
			continue // finished tasks age out as intended
		}
		ctl := s.controls.Get(id)
		if ctl.State == contract.StateCancelled {
			continue
		}
		if state == "" && !waits(ctl.State) {
			// No progress: status forgot the task after STATUS_RETENTION
			// (it finished long ago), or has not seen it yet (a later round
			// keeps it then). Rewriting it would keep the record for ever.
			continue
		}
		var rec contract.TaskRecord
		if json.Unmarshal(e.Value(), &rec) == nil && ctl.State == contract.StateAwaitingApproval &&
			time.Since(rec.AcceptedAt) > approvalWindow(ttl) && s.stillAwaitsApproval(ctx, id) {
			if err := s.expireApproval(ctx, &rec, ttl); err != nil {
				return n, err
			}
			continue
		}
		if _, err := s.tasks.Put(ctx, id, e.Value()); err != nil {
			return n, fmt.Errorf("task record %s: %w", id, err)
		}
		if c, err := s.control.Get(ctx, id); err == nil {
			if _, err := s.control.Put(ctx, id, c.Value()); err != nil {
				return n, fmt.Errorf("run state of %s: %w", id, err)
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return n, err
		}
		n++
	}
	return n, nil
}

// waits reports whether a run state holds a task back (paused, scheduled,
// awaiting approval): it is live though it may have no progress yet.
func waits(state contract.TaskState) bool {
	return state == contract.StatePaused || state == contract.StateScheduled || state == contract.StateAwaitingApproval
}

// approvalWindow is how long a task may await approval: five sixths of the
// retention (25 days of 30), leaving room to send.
func approvalWindow(ttl time.Duration) time.Duration { return ttl / 6 * 5 }

// stillAwaitsApproval confirms from the bucket what the view says before
// a task is cancelled for want of approval: the view may lag behind an
// approval given moments ago (after a server restart, for seconds).
func (s *Service) stillAwaitsApproval(ctx context.Context, taskID string) bool {
	ctl, err := s.controls.Read(ctx, taskID)
	return err == nil && ctl.State == contract.StateAwaitingApproval
}

// expireApproval cancels a task whose approval did not come in time.
func (s *Service) expireApproval(ctx context.Context, rec *contract.TaskRecord, ttl time.Duration) error {
	reason := fmt.Sprintf("not approved within %s of its submission, which is kept %s", roughly(approvalWindow(ttl)), roughly(ttl))
	s.log.Warn("task cancelled: approval did not come in time", shared.KeyTaskID, rec.Task.ID, "reason", reason)
	if err := shared.PutControl(ctx, s.control, rec.Task.ID, contract.Control{State: contract.StateCancelled, Reason: reason}); err != nil {
		return err
	}
	return s.cancelUnreleased(ctx, rec)
}

// roughly rounds d for a message: to the hour from a day up, else to the
// second.
func roughly(d time.Duration) time.Duration {
	if d >= 24*time.Hour {
		return d.Round(time.Hour)
	}
	return d.Round(time.Second)
}
