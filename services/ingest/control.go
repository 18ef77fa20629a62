package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// serveControl answers requests on broadcast.control.<task>: pause, resume,
// cancel and retry-dead. Ingest owns a task's lifecycle, so it keeps the
// run state (KV broadcast_control) that dispatch and status follow.
func (s *Service) serveControl(m *nats.Msg) {
	defer shared.Recover(s.log, "control request "+m.Subject, nil) // the caller times out
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	taskID := strings.TrimPrefix(m.Subject, contract.SubjectControlPrefix)
	reply := s.control1(ctx, taskID, m.Data)
	if !reply.OK {
		s.log.Warn("control request refused", shared.KeyTaskID, taskID, "err", reply.Error)
	}
	data, _ := json.Marshal(reply)
	if m.Reply != "" {
		_ = m.Respond(data)
	}
}

func (s *Service) control1(ctx context.Context, taskID string, body []byte) contract.ControlReply {
	fail := func(format string, args ...any) contract.ControlReply {
		return contract.ControlReply{OK: false, Error: fmt.Sprintf(format, args...)}
	}
	var req contract.ControlRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return fail("request: invalid JSON: %v", err)
	}
	if !contract.ValidID(taskID) {
		return fail("task: %q is not a task id", taskID)
	}
	if req.Action != contract.ActionRetryDead {
		// Pause, resume and cancel of one task apply in the order they came;
		// retry-dead may run beside them (liftOutrunPause takes the lock).
		unlock := s.taskLocks.Lock(taskID)
		defer unlock()
	}
	rec, err := s.record(ctx, taskID)
	if err != nil {
		return fail("task: %v", err)
	}
	// The bucket, not the watch's view: after a server restart the view
	// lags until its watch starts over (seconds), and a resume judged by a
	// stale "processing" did nothing and left the task paused.
	ctl, err := s.controls.Read(ctx, taskID)
	if err != nil {
		return fail("%v", err)
	}
	final, finalState := s.isFinal(ctx, taskID)
	if final && req.Action != contract.ActionRetryDead {
		return fail("task %s is already %s", taskID, finalState)
	}
	if ctl.State == contract.StateCancelled && req.Action != contract.ActionCancel {
		return fail("task %s is cancelled", taskID)
	}
	log := s.log.With(shared.KeyTaskID, taskID, "action", req.Action)
	put := func(state contract.TaskState, reason string) error {
		return shared.PutControl(ctx, s.control, taskID, contract.Control{State: state, Reason: reason})
	}
	switch req.Action {
	case contract.ActionPause:
		if ctl.State == contract.StatePaused {
			return contract.ControlReply{OK: true, State: contract.StatePaused}
		}
		if !ctl.Sends() {
			return fail("task %s is %s; only a processing task can be paused", taskID, ctl.State)
		}
		if err := put(contract.StatePaused, req.Reason); err != nil {
			return fail("%v", err)
		}
		log.Info("task paused", "reason", req.Reason)
		return contract.ControlReply{OK: true, State: contract.StatePaused}

	case contract.ActionResume:
		switch ctl.State {
		case "", contract.StateProcessing:
			return contract.ControlReply{OK: true, State: contract.StateProcessing}
		case contract.StateAwaitingApproval, contract.StateScheduled:
			task, ch, err := s.original(ctx, rec)
			if err != nil {
				return fail("%v", err)
			}
			if ctl.State == contract.StateScheduled && len(task.TestRecipients) > 0 {
				// Resuming a scheduled task starts it now, test recipients first.
				if err := s.begin(ctx, rec, false); err != nil {
					return fail("%v", err)
				}
				return contract.ControlReply{OK: true, State: contract.StateAwaitingApproval}
			}
			if err := s.release(ctx, rec, task, ch, false, false); err != nil {
				return fail("%v", err)
			}
		default:
			if err := put(contract.StateProcessing, ""); err != nil {
				return fail("%v", err)
			}
		}
		log.Info("task resumed")
		go s.askUnpark(taskID)
		return contract.ControlReply{OK: true, State: contract.StateProcessing}

	case contract.ActionCancel:
		if err := put(contract.StateCancelled, req.Reason); err != nil {
			return fail("%v", err)
		}
		if !rec.Expanded {
			// Nothing was enqueued for these recipients: cancel them here.
			if err := s.cancelUnreleased(ctx, rec); err != nil {
				return fail("%v", err)
			}
		}
		log.Info("task cancelled")
		go s.askUnpark(taskID)
		return contract.ControlReply{OK: true, State: contract.StateCancelled}

	case contract.ActionRetryDead:
		if len(req.Seqs) > contract.MaxRetrySelection {
			return fail("seqs: at most %d dead letters at once, got %d", contract.MaxRetrySelection, len(req.Seqs))
		}
		outran := false
		if final && ctl.State == contract.StatePaused {
			if outran, err = s.liftOutrunPause(ctx, taskID); err != nil {
				return fail("%v", err)
			}
		}
		n, err := s.askRetryDead(ctx, rec.Task.ID, req.Seqs)
		if err != nil {
			return fail("%v", err)
		}
		if outran {
			go s.askUnpark(taskID) // any parked by a view of the pause not yet lifted
		}
		log.Info("dead letters re-queued", "count", n, "pause_lifted", outran)
		return contract.ControlReply{OK: true, State: contract.StateProcessing, Requeued: n}
	}
	return fail("action: must be pause, resume, cancel or retry-dead, got %q", req.Action)
}

// liftOutrunPause sets a final task's run state from paused back to
// processing, under the task's lock, for a retry-dead: a pause that came
// just before the task's last outcomes held a run that has ended, and the
// re-queued recipients are not held by it (they would wait parked, the
// task paused again, while a resume is refused for a final task;
// multi-process scenario seed 959139463). It reports whether it lifted one.
func (s *Service) liftOutrunPause(ctx context.Context, taskID string) (bool, error) {
	unlock := s.taskLocks.Lock(taskID)
	defer unlock()
	ctl, err := s.controls.Read(ctx, taskID)
	if err != nil || ctl.State != contract.StatePaused {
		return false, err
	}
	return true, shared.PutControl(ctx, s.control, taskID, contract.Control{State: contract.StateProcessing})
}

func (s *Service) isFinal(ctx context.Context, taskID string) (bool, contract.TaskState) {
	e, err := s.progress.Get(ctx, taskID)
	if err != nil {
		return false, ""
	}
	var p contract.Progress
	if json.Unmarshal(e.Value(), &p) != nil {
		return false, ""
	}
	return p.State.Final(), p.State
}

// cancelUnreleased publishes a cancelled event for every recipient of a task
// whose recipients were never enqueued (scheduled or awaiting approval).
func (s *Service) cancelUnreleased(ctx context.Context, rec *contract.TaskRecord) error {
	return s.cancelFrom(ctx, rec, 0, "task cancelled before it started")
}

// cancelFrom publishes a cancelled event for the task's recipients from
// index first on, none of which was handed to render.
func (s *Service) cancelFrom(ctx context.Context, rec *contract.TaskRecord, first int, reason string) error {
	futures := make([]jetstream.PubAckFuture, 0, min(max(rec.Total-first, 0), 4096))
	for i := first; i < rec.Total; i++ {
		f, err := shared.PublishEventAsync(s.js, &contract.Event{TaskID: rec.Task.ID, JobID: contract.JobID(rec.Task.ID, i, false),
			Kind: contract.EventCancelled, Index: i, Code: "cancelled", Error: reason})
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	return waitAll(ctx, futures)
}

func waitAll(ctx context.Context, futures []jetstream.PubAckFuture) error {
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
