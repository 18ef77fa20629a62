package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// serveControl answers requests on broadcast.control.<task>: pause, resume,
// cancel and retry-dead. Ingest owns a task's lifecycle, so it keeps the
// run state (KV broadcast_control) that dispatch and status follow.
func (s *Service) serveControl(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	taskID := strings.TrimPrefix(m.Subject, shared.SubjectControlPrefix)
	reply := s.control1(ctx, taskID, m.Data)
	if !reply.OK {
		s.log.Warn("control request refused", shared.KeyTaskID, taskID, "err", reply.Error)
	}
	data, _ := json.Marshal(reply)
	if m.Reply != "" {
		_ = m.Respond(data)
	}
}

func (s *Service) control1(ctx context.Context, taskID string, body []byte) shared.ControlReply {
	fail := func(format string, args ...any) shared.ControlReply {
		return shared.ControlReply{OK: false, Error: fmt.Sprintf(format, args...)}
	}
	var req shared.ControlRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return fail("request: invalid JSON: %v", err)
	}
	if !shared.ValidID(taskID) {
		return fail("task: %q is not a task id", taskID)
	}
	rec, err := s.record(ctx, taskID)
	if err != nil {
		return fail("task: %v", err)
	}
	ctl := s.controls.Get(taskID)
	final, finalState := s.isFinal(ctx, taskID)
	if final && req.Action != shared.ActionRetryDead {
		return fail("task %s is already %s", taskID, finalState)
	}
	if ctl.State == shared.StateCancelled && req.Action != shared.ActionCancel {
		return fail("task %s is cancelled", taskID)
	}
	log := s.log.With(shared.KeyTaskID, taskID, "action", req.Action)
	put := func(state shared.TaskState, reason string) error {
		return shared.PutControl(ctx, s.control, taskID, shared.Control{State: state, Reason: reason})
	}
	switch req.Action {
	case shared.ActionPause:
		if ctl.State == shared.StatePaused {
			return shared.ControlReply{OK: true, State: shared.StatePaused}
		}
		if !ctl.Sends() {
			return fail("task %s is %s; only a processing task can be paused", taskID, ctl.State)
		}
		if err := put(shared.StatePaused, req.Reason); err != nil {
			return fail("%v", err)
		}
		log.Info("task paused", "reason", req.Reason)
		return shared.ControlReply{OK: true, State: shared.StatePaused}

	case shared.ActionResume:
		switch ctl.State {
		case "", shared.StateProcessing:
			return shared.ControlReply{OK: true, State: shared.StateProcessing}
		case shared.StateAwaitingApproval, shared.StateScheduled:
			task, ch, err := s.original(ctx, rec)
			if err != nil {
				return fail("%v", err)
			}
			if ctl.State == shared.StateScheduled && len(task.TestRecipients) > 0 {
				// Resuming a scheduled task starts it now, test recipients first.
				if err := s.begin(ctx, rec); err != nil {
					return fail("%v", err)
				}
				return shared.ControlReply{OK: true, State: shared.StateAwaitingApproval}
			}
			if err := s.release(ctx, rec, task, ch); err != nil {
				return fail("%v", err)
			}
		default:
			if err := put(shared.StateProcessing, ""); err != nil {
				return fail("%v", err)
			}
		}
		log.Info("task resumed")
		go s.unpark(context.WithoutCancel(ctx), taskID)
		return shared.ControlReply{OK: true, State: shared.StateProcessing}

	case shared.ActionCancel:
		if err := put(shared.StateCancelled, req.Reason); err != nil {
			return fail("%v", err)
		}
		if !rec.Expanded {
			// Nothing was enqueued for these recipients: cancel them here.
			if err := s.cancelUnreleased(ctx, rec); err != nil {
				return fail("%v", err)
			}
		}
		log.Info("task cancelled")
		go s.unpark(context.WithoutCancel(ctx), taskID)
		return shared.ControlReply{OK: true, State: shared.StateCancelled}

	case shared.ActionRetryDead:
		n, err := s.retryDead(ctx, rec)
		if err != nil {
			return fail("%v", err)
		}
		log.Info("dead letters re-queued", "count", n)
		return shared.ControlReply{OK: true, State: shared.StateProcessing, Requeued: n}
	}
	return fail("action: must be pause, resume, cancel or retry-dead, got %q", req.Action)
}

func (s *Service) isFinal(ctx context.Context, taskID string) (bool, shared.TaskState) {
	e, err := s.progress.Get(ctx, taskID)
	if err != nil {
		return false, ""
	}
	var p shared.Progress
	if json.Unmarshal(e.Value(), &p) != nil {
		return false, ""
	}
	return p.State.Final(), p.State
}

// cancelUnreleased publishes a cancelled event for every recipient of a task
// whose recipients were never enqueued (scheduled or awaiting approval).
func (s *Service) cancelUnreleased(ctx context.Context, rec *shared.TaskRecord) error {
	futures := make([]jetstream.PubAckFuture, 0, min(rec.Total, 4096))
	for i := range rec.Total {
		f, err := shared.PublishEventAsync(s.js, &shared.Event{TaskID: rec.Task.ID, JobID: shared.JobID(rec.Task.ID, i, false),
			Kind: shared.EventCancelled, Index: i, Code: "cancelled", Error: "task cancelled before it started"})
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

// unpark puts a task's parked jobs back in their accounts' queues, where
// dispatch sends them (or cancels or expires them).
func (s *Service) unpark(ctx context.Context, taskID string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	n, err := s.drain(ctx, shared.StreamJobs, shared.ParkedFilter(taskID), func(m jetstream.Msg) error {
		var job shared.Job
		if err := json.Unmarshal(m.Data(), &job); err != nil {
			return nil // undecodable: dispatch would dead-letter it; drop from parking
		}
		_, err := s.js.Publish(ctx, shared.JobSubject(job.Account, job.Priority), m.Data(),
			jetstream.WithMsgID(fmt.Sprintf("%s:unpark:%d", job.MsgID(), seqOf(m))))
		return err
	})
	if err != nil {
		s.log.Warn("unparking stopped; the sweeper will finish it", shared.KeyTaskID, taskID, "err", err)
	}
	if n > 0 {
		s.log.Info("parked jobs re-queued", shared.KeyTaskID, taskID, "count", n)
	}
}

func seqOf(m jetstream.Msg) uint64 {
	if meta, err := m.Metadata(); err == nil {
		return meta.Sequence.Stream
	}
	return 0
}

// drain reads every message on filter of a work-queue stream with a
// temporary consumer, calls fn, and acknowledges (removes) each one fn
// handled.
func (s *Service) drain(ctx context.Context, stream, filter string, fn func(jetstream.Msg) error) (int, error) {
	cons, err := s.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckExplicitPolicy,
		InactiveThreshold: time.Minute,
		MaxAckPending:     1000,
	})
	if err != nil {
		return 0, err
	}
	defer func() { _ = s.js.DeleteConsumer(context.WithoutCancel(ctx), stream, cons.CachedInfo().Name) }()
	n := 0
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			return n, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if err := fn(m); err != nil {
				return n, err
			}
			if err := m.Ack(); err != nil {
				return n, err
			}
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return n, err
		}
		if got == 0 {
			return n, nil
		}
	}
}

// sweepParked re-queues parked jobs of tasks that run again (or were
// cancelled, or expired) but still have parked jobs, e.g. a job parked by a
// dispatch process that saw the resume a moment late.
func (s *Service) sweepParked(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stream, err := s.js.Stream(ctx, shared.StreamJobs)
		if err != nil {
			continue
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(shared.SubjectParkedPrefix+">"))
		if err != nil {
			continue
		}
		tasks := map[string]bool{}
		for subj := range info.State.Subjects {
			if id, _, ok := strings.Cut(strings.TrimPrefix(subj, shared.SubjectParkedPrefix), "."); ok {
				tasks[id] = true
			}
		}
		for id := range tasks {
			ctl := s.controls.Get(id)
			if ctl.Sends() || ctl.State == shared.StateCancelled || s.expired(ctx, id) {
				s.unpark(ctx, id)
			}
		}
	}
}

func (s *Service) expired(ctx context.Context, taskID string) bool {
	rec, err := s.record(ctx, taskID)
	if err != nil {
		return false
	}
	exp := rec.Task.ExpiryTime()
	return !exp.IsZero() && time.Now().After(exp)
}
