package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// startConsumerConfig reads the scheduled starts of tasks with send_at.
func startConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerIngestStart,
		Description:   "ingest: starts scheduled tasks when send_at comes",
		FilterSubject: contract.SubjectStartPrefix + "*",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
	}
}

// startLead is how early the scheduled start fires; ingest then waits for
// send_at itself, so second-granular schedules still start on time.
const startLead = time.Second

// scheduleStart stores a JetStream scheduled message that fires just before
// sendAt onto broadcast.start.<task>: until then the task holds nothing per
// recipient, and the schedule survives restarts of every service.
func (s *Service) scheduleStart(ctx context.Context, taskID string, sendAt time.Time) error {
	_, err := s.js.Publish(ctx, contract.SubjectStartPrefix+taskID+".at", []byte(taskID),
		jetstream.WithScheduleAt(sendAt.Add(-startLead)),
		jetstream.WithScheduleTarget(contract.SubjectStartPrefix+taskID))
	if err != nil {
		return fmt.Errorf("schedule start: %w", err)
	}
	return nil
}

// handleStart runs when a scheduled task is due.
func (s *Service) handleStart(ctx context.Context, msg jetstream.Msg) error {
	taskID := string(msg.Data())
	rec, err := s.record(ctx, taskID)
	if err != nil {
		return err
	}
	// The run state comes from the bucket, not the view, which may lag
	// behind a state written moments ago: a task scheduled just after a
	// server restart would find none there and never start (seed
	// 860129467), and one whose release was cut short after it was
	// marked processing would still read "scheduled" there and wait for
	// send_at instead of finishing its release. One read per start.
	ctl, err := s.controls.Read(ctx, taskID)
	if err != nil {
		return err
	}
	if ctl.State == contract.StateProcessing && rec.Released && !rec.Expanded {
		// A release cut short (ingest stopped after marking the task
		// processing, before every batch was published): finish it.
		task, ch, err := s.original(ctx, rec)
		if err != nil {
			return err
		}
		return s.release(ctx, rec, task, ch, true, true)
	}
	if ctl.State != contract.StateScheduled {
		// Started early by a resume, or cancelled: nothing to do.
		s.log.Info("scheduled start ignored", shared.KeyTaskID, taskID, "state", ctl.State)
		return nil
	}
	if wait := time.Until(rec.Task.SendTime()); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	redelivered := false
	if meta, err := msg.Metadata(); err == nil && meta.NumDelivered > 1 {
		redelivered = true
	}
	return s.begin(ctx, rec, redelivered)
}

// begin moves a scheduled task on: to its test recipients and approval, or
// straight to sending.
func (s *Service) begin(ctx context.Context, rec *contract.TaskRecord, redelivered bool) error {
	task, ch, err := s.original(ctx, rec)
	if err != nil {
		return err
	}
	if len(task.TestRecipients) > 0 {
		if ok, err := s.advance(ctx, task.ID, contract.StateAwaitingApproval); !ok {
			return err
		}
		return s.publishTestBatches(ctx, task, ch, redelivered)
	}
	return s.release(ctx, rec, task, ch, redelivered, true)
}

// release publishes the task's recipients and marks it running.
// redelivered says the request to release may have run before. runFirst
// marks the task running before its recipients are published, for a
// scheduled start: otherwise a job that reached dispatch while the task
// still read "scheduled" was parked, and a start under load began 1.7 s
// late. A release cut short after that is finished by the start message's
// redelivery (handleStart). An approval (a resume request, nothing to
// redeliver) marks the task running last, so asking again finishes it.
func (s *Service) release(ctx context.Context, rec *contract.TaskRecord, task *contract.Task, ch channels.Channel, redelivered, runFirst bool) error {
	resumed := redelivered || rec.Released
	if !rec.Released {
		rec.Released = true
		if err := s.putRecord(ctx, rec); err != nil {
			return err
		}
	}
	if runFirst {
		if ok, err := s.advance(ctx, task.ID, contract.StateProcessing); !ok {
			return err
		}
	}
	if task.RecipientsObject != "" {
		idx, err := s.indexList(ctx, ch, task.RecipientsObject, rec.ListDigest)
		if err == nil {
			err = s.publishList(ctx, ch, rec, idx, resumed)
		}
		if isListChanged(err) {
			return s.cancelForList(ctx, rec, err)
		}
		if err != nil {
			return err
		}
	} else {
		exp := expand(ch, task.Recipients)
		if err := s.publishBatches(ctx, batches(task.ID, exp.recipients, s.batchSize(rec), s.batchBytes, false), resumed); err != nil {
			return err
		}
	}
	if !runFirst {
		if _, err := s.advance(ctx, task.ID, contract.StateProcessing); err != nil {
			return err
		}
	}
	rec.Expanded = true
	if err := s.putRecord(ctx, rec); err != nil {
		s.log.Warn("could not mark task expanded", shared.KeyTaskID, task.ID, "err", err)
	}
	s.log.Info("task released", shared.KeyTaskID, task.ID, "total", rec.Total)
	return nil
}

// advance moves a task that is starting (scheduled, awaiting approval) to
// state, unless an operator cancelled or paused it meanwhile, or, for
// awaiting approval, it has been approved already: the change is
// a compare-and-set on the control value, so a cancel that lands while a
// scheduled start waits for send_at, or while an approval publishes the
// recipients, is never overwritten (a cancelled scheduled task was sent
// anyway: the scenario tester, seed 15). It reports whether the task moved.
func (s *Service) advance(ctx context.Context, taskID string, state contract.TaskState) (bool, error) {
	for {
		e, err := s.control.Get(ctx, taskID)
		var rev uint64
		if err == nil {
			var cur contract.Control
			if err := json.Unmarshal(e.Value(), &cur); err != nil {
				return false, fmt.Errorf("control state of %s: %w", taskID, err)
			}
			if cur.State == contract.StateCancelled || cur.State == contract.StatePaused {
				s.log.Info("task not started: an operator changed it", shared.KeyTaskID, taskID, "state", cur.State)
				return false, nil
			}
			if state == contract.StateAwaitingApproval && cur.State == contract.StateProcessing {
				// Approved already: a scheduled start that read "scheduled"
				// before it waited for send_at, while a resume started the
				// task and an approval released it, must not send it back
				// to approval (it was never sent: seed 77967254).
				s.log.Info("scheduled start ignored: the task is approved already", shared.KeyTaskID, taskID)
				return false, nil
			}
			rev = e.Revision()
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, fmt.Errorf("control state of %s: %w", taskID, err)
		}
		data, err := json.Marshal(contract.Control{State: state, At: time.Now().UTC()})
		if err != nil {
			return false, err
		}
		if rev == 0 {
			_, err = s.control.Create(ctx, taskID, data)
		} else {
			_, err = s.control.Update(ctx, taskID, data, rev)
		}
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue // changed under us: look again
		default:
			return false, fmt.Errorf("control state of %s: %w", taskID, err)
		}
	}
}

// publishTestBatches sends the test recipients ahead of the task.
func (s *Service) publishTestBatches(ctx context.Context, task *contract.Task, ch channels.Channel, resumed bool) error {
	exp := expand(ch, task.TestRecipients)
	return s.publishBatches(ctx, batches(task.ID, exp.recipients, s.cfg.BatchSize, s.batchBytes, true), resumed)
}

// record reads a task's record.
func (s *Service) record(ctx context.Context, taskID string) (*contract.TaskRecord, error) {
	e, err := s.tasks.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, shared.Permanent(fmt.Errorf("no task %q", taskID))
	}
	if err != nil {
		return nil, err
	}
	var rec contract.TaskRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, shared.Permanent(fmt.Errorf("task record %s: %w", taskID, err))
	}
	return &rec, nil
}

// original re-reads the task as submitted (the record keeps no inline
// recipients) from the TASKS stream.
func (s *Service) original(ctx context.Context, rec *contract.TaskRecord) (*contract.Task, channels.Channel, error) {
	stream, err := s.js.Stream(ctx, contract.StreamTasks)
	if err != nil {
		return nil, nil, err
	}
	raw, err := stream.GetMsg(ctx, rec.Seq)
	if err != nil {
		return nil, nil, fmt.Errorf("task %s submission (TASKS seq %d): %w", rec.Task.ID, rec.Seq, err)
	}
	task, err := contract.DecodeTask(raw.Data)
	if err != nil {
		return nil, nil, shared.Permanent(err)
	}
	task.ID = rec.Task.ID
	task.Normalize()
	ch, err := s.cfg.Channels.Get(task.Channel)
	if err != nil {
		return nil, nil, shared.Permanent(err)
	}
	return task, ch, nil
}

// isListChanged reports a *listChangedError.
func isListChanged(err error) bool {
	var lc *listChangedError
	return errors.As(err, &lc)
}

// cancelForList cancels a task whose recipients_object was replaced after
// it was accepted: the recipients not yet handed to render are cancelled
// with the reason (those already published are cancelled by dispatch,
// which follows the run state), and the reason is the task's.
func (s *Service) cancelForList(ctx context.Context, rec *contract.TaskRecord, cause error) error {
	reason := cause.Error()
	s.log.Error("task cancelled: its recipient list changed", shared.KeyTaskID, rec.Task.ID, "err", cause)
	if err := shared.PutControl(ctx, s.control, rec.Task.ID, contract.Control{State: contract.StateCancelled, Reason: reason}); err != nil {
		return err
	}
	if err := s.cancelFrom(ctx, rec, rec.Checkpoint, reason); err != nil {
		return err
	}
	rec.Expanded = true
	return s.putRecord(ctx, rec)
}
