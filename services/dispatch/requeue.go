package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// This file re-queues parked jobs and dead letters. It used to live in
// ingest (which answers the control requests that trigger it); it moved here
// so that ingest needs no right to publish jobs: ingest asks on
// broadcast.requeue.<task> (see contract/requeue.go) and dispatch, which parks
// and dead-letters the jobs in the first place, puts them back.

// requeueConcurrency bounds the re-queue requests served at once.
const requeueConcurrency = 16

// startRequeue serves re-queue requests and sweeps parked jobs until ctx
// ends; the returned function closes the subscription once the requests
// in hand are answered, and waits for the sweeper.
func (s *Service) startRequeue(ctx context.Context) (stop func(), err error) {
	// Served concurrently: one long retry-dead must not hold up the unpark
	// of a resumed task behind it.
	served := shared.NewConcurrentHandler(requeueConcurrency)
	sub, err := s.js.Conn().QueueSubscribe(contract.SubjectRequeuePrefix+"*", "dispatch", served.Wrap(func(m *nats.Msg) {
		defer shared.Recover(s.log, "re-queue request "+m.Subject, nil)
		s.serveRequeue(ctx, m)
	}))
	if err != nil {
		return nil, fmt.Errorf("dispatch: requeue subscription: %w", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); shared.Supervise(ctx, s.log, "parked-job sweeper", s.sweepParked) }()
	return func() { served.Drain(sub); <-done }, nil
}

// serveRequeue answers one request from ingest.
func (s *Service) serveRequeue(ctx context.Context, m *nats.Msg) {
	taskID := strings.TrimPrefix(m.Subject, contract.SubjectRequeuePrefix)
	reply := contract.RequeueReply{OK: true}
	var req contract.RequeueRequest
	switch err := json.Unmarshal(m.Data, &req); {
	case err != nil:
		reply = contract.RequeueReply{Error: fmt.Sprintf("request: invalid JSON: %v", err)}
	case !contract.ValidID(taskID):
		reply = contract.RequeueReply{Error: fmt.Sprintf("task: %q is not a task id", taskID)}
	case req.Action == contract.RequeueParked:
		// A large backlog takes a while: answer now, work in the background
		// (the sweeper finishes what an interrupted run leaves).
		go func() {
			defer shared.Recover(s.log, "unparking task "+taskID, nil) // the sweeper finishes it
			s.unpark(context.WithoutCancel(ctx), taskID)
		}()
	case req.Action == contract.RequeueDead:
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		var n int
		var err error
		if len(req.Seqs) > 0 {
			n, err = s.retryDeadSelected(rctx, taskID, req.Seqs)
		} else {
			n, err = s.retryDead(rctx, taskID)
		}
		cancel()
		reply.Requeued = n
		if err != nil {
			reply = contract.RequeueReply{Requeued: n, Error: err.Error()}
		}
		s.log.Info("dead letters re-queued", shared.KeyTaskID, taskID, "count", n, "err", err)
	default:
		reply = contract.RequeueReply{Error: fmt.Sprintf("action: must be %s or %s, got %q", contract.RequeueParked, contract.RequeueDead, req.Action)}
	}
	if m.Reply != "" {
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	}
}

// unpark puts a task's parked jobs back in their accounts' queues, where
// dispatch sends them (or cancels or expires them).
func (s *Service) unpark(ctx context.Context, taskID string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	n, err := s.takeAll(ctx, contract.ParkedFilter(taskID), func(m jetstream.Msg) error {
		var job contract.Job
		if err := json.Unmarshal(m.Data(), &job); err != nil {
			// Never dropped silently: kept in DEAD with its raw bytes.
			return s.deadLetter(ctx, m, fmt.Errorf("parked job does not decode: %v", err))
		}
		return s.requeueCopy(ctx, m, &job, "unpark")
	})
	if err != nil {
		s.log.Warn("unparking stopped; the sweeper will finish it", shared.KeyTaskID, taskID, "err", err)
	}
	if n > 0 {
		s.log.Info("parked jobs re-queued", shared.KeyTaskID, taskID, "count", n)
	}
}

// requeueCopy publishes m, a copy of job that waited (parked, held), to
// job's lane, with a Nats-Msg-Id naming m and what re-queues it, and m's
// copyHeader: should the window forget that id (a server restart) and m
// be re-queued twice, or its schedule fire as well, the first delivery
// claims the copy's record and the other is not handled (claimCopy).
func (s *Service) requeueCopy(ctx context.Context, m jetstream.Msg, job *contract.Job, action string) error {
	out := nats.NewMsg(contract.JobSubject(job.Account, job.Priority))
	out.Data = m.Data()
	if h := m.Headers(); h != nil && h.Get(copyHeader) != "" {
		out.Header.Set(copyHeader, h.Get(copyHeader))
	}
	_, err := s.js.PublishMsg(ctx, out, jetstream.WithMsgID(fmt.Sprintf("%s:%s:%d", job.MsgID(), action, seqOf(m))))
	return err
}

func seqOf(m jetstream.Msg) uint64 {
	if meta, err := m.Metadata(); err == nil {
		return meta.Sequence.Stream
	}
	return 0
}

// errSkip, returned by a takeAll function, leaves that message in the
// stream (unacknowledged) and goes on with the next.
var errSkip = errors.New("skip")

// takeAll reads every message on filter of JOBS with a temporary
// consumer, calls fn, and acknowledges (removes) each one fn handled.
//
// Most takes find nothing (an account edit wakes the held jobs of every
// account of its channel), so the stream's last message on the filter is
// asked first: that costs the server a lookup, where a consumer is a
// creation and a removal (with 1,000 accounts, a thousand of each per
// edit). The consumer keeps its state in memory: it lives for one take.
func (s *Service) takeAll(ctx context.Context, filter string, fn func(jetstream.Msg) error) (int, error) {
	if _, err := s.jobs.GetLastMsgForSubject(ctx, filter); errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	cons, err := s.jobs.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckExplicitPolicy,
		InactiveThreshold: time.Minute,
		MaxAckPending:     1000,
		// A skipped message is not offered again to this consumer.
		MaxDeliver:    1,
		MemoryStorage: true,
	})
	if err != nil {
		return 0, err
	}
	defer func() { _ = s.jobs.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	if cons.CachedInfo().NumPending == 0 {
		return 0, nil
	}
	n := 0
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			return n, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if err := fn(m); errors.Is(err, errSkip) {
				continue
			} else if err != nil {
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
		stream, err := s.js.Stream(ctx, contract.StreamJobs)
		if err != nil {
			continue
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectParkedPrefix+">"))
		if err != nil {
			continue
		}
		tasks := map[string]bool{}
		for subj := range info.State.Subjects {
			if id, _, ok := strings.Cut(strings.TrimPrefix(subj, contract.SubjectParkedPrefix), "."); ok {
				tasks[id] = true
			}
		}
		for id := range tasks {
			ctl, err := s.controls.Read(ctx, id) // not the view, which may lag
			if err != nil {
				continue
			}
			if ctl.Sends() || ctl.State == contract.StateCancelled || s.taskExpired(ctx, id) {
				s.unpark(ctx, id)
			}
		}
	}
}

// taskExpired reports whether the task's expires_at has passed, from its
// record in KV broadcast_tasks.
func (s *Service) taskExpired(ctx context.Context, taskID string) bool {
	e, err := s.tasks.Get(ctx, taskID)
	if err != nil {
		return false
	}
	var rec contract.TaskRecord
	if json.Unmarshal(e.Value(), &rec) != nil {
		return false
	}
	exp := rec.Task.ExpiryTime()
	return !exp.IsZero() && time.Now().After(exp)
}

// retryDead puts a task's dead letters back in the queue through the same
// pacing as any job: a new generation of each job (so the stream does not
// drop it as a duplicate) with its attempts reset, and a requeued retrying
// event that moves the recipient from failed back to retrying. The dead
// letters re-queued are then purged; any that fail again are dead-lettered
// anew.
//
// Only the dead letters present when it starts are re-queued: one that fails
// again while it runs arrives as a new dead letter behind them and must wait
// for the next retry-dead (before, a recipient that kept failing was
// re-queued again and again within one request).
func (s *Service) retryDead(ctx context.Context, taskID string) (int, error) {
	stream, err := s.js.Stream(ctx, contract.StreamDead)
	if err != nil {
		return 0, err
	}
	subject := contract.DeadSubject(taskID)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	pending := info.State.Subjects[subject]
	if pending == 0 {
		return 0, nil
	}
	last := info.State.LastSeq // no dead letter of this request is newer
	cons, err := s.js.OrderedConsumer(ctx, contract.StreamDead, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return 0, err
	}
	var lastSeq uint64
	requeued := 0
	// kept are the letters without a job to re-send (raw, undecodable, or
	// a batch render gave up on): they are written again behind the purge,
	// so retry-dead never deletes what it did not re-queue.
	var kept [][]byte
	for read := uint64(0); read < pending; {
		batch, err := cons.Fetch(int(min(500, pending-read)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return requeued, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			meta, err := m.Metadata()
			if err != nil {
				return requeued, err
			}
			if meta.Sequence.Stream > last {
				read = pending // a dead letter newer than the request: stop
				break
			}
			lastSeq = meta.Sequence.Stream
			var dl contract.DeadLetter
			if err := json.Unmarshal(m.Data(), &dl); err != nil || dl.Job.ID == "" {
				kept = append(kept, m.Data()) // nothing to re-send
				continue
			}
			if err := s.requeue(ctx, &dl.Job); err != nil {
				return requeued, err
			}
			requeued++
		}
		if got == 0 {
			break
		}
	}
	for i, data := range kept {
		if _, err := s.js.Publish(ctx, subject, data, jetstream.WithMsgID(fmt.Sprintf("%s:kept:%d:%d", taskID, lastSeq, i))); err != nil {
			return requeued, fmt.Errorf("keep dead letters without a job: %w", err)
		}
	}
	if lastSeq > 0 {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(lastSeq+1)); err != nil {
			return requeued, fmt.Errorf("purge re-queued dead letters: %w", err)
		}
	}
	return requeued, nil
}

// requeue publishes a new generation of job to a usable account of its pool.
func (s *Service) requeue(ctx context.Context, job *contract.Job) error {
	job.Generation++
	job.Attempts, job.Recheck = 0, true
	if candidates := s.accounts.ForTask(job.Channel, s.poolOf(ctx, job)); len(candidates) > 0 {
		job.Account = shared.PickAccount(candidates, job.To, nil).Name
	}
	if err := shared.PublishEvent(ctx, s.js, &contract.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: job.Account,
		Kind: contract.EventRetrying, Index: job.Index, Requeued: true, Code: "retry_dead", Error: "dead letter re-queued"}); err != nil {
		return err
	}
	data, err := contract.EncodeJob(job)
	if err != nil {
		return err
	}
	_, err = s.js.Publish(ctx, contract.JobSubject(job.Account, job.Priority), data, jetstream.WithMsgID(job.MsgID()))
	return err
}
