package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// turnCheck is how long a job waits for its turn (scheduler) before it
// checks again that it may still be sent: a pause, cancel or expiry of a
// waiting job (a low job behind a long normal queue, say) applies within it.
const turnCheck = 500 * time.Millisecond

// handle takes one job of lane through the ledger, expiry, the account's
// health, caps, its turn (priority and pacing, sched.go), the provider
// call, and the outcome. It returns what the consume loop should do; waits
// longer than Config.LongWait are scheduled re-publications, so they hold
// no MaxAckPending slot.
func (r *accountRunner) handle(ctx context.Context, sched *scheduler, lane int, msg jetstream.Msg) error {
	// The job counts as its lane's work from now on, so lower lanes wait
	// for it (sched.go), until it is sent or leaves.
	turn := sched.begin(lane)
	defer turn.finish()
	s := r.svc
	var job contract.Job
	if err := contract.DecodeJob(msg.Data(), &job); err != nil {
		return shared.Permanent(&giveUp{class: contract.ClassPermanent, code: "bad_job", err: fmt.Sprintf("job does not decode: %v", err)})
	}
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	attempt := job.Attempts + int(meta.NumDelivered)
	acct, sender := r.current()
	log := &jobLogger{base: r.log, job: &job, attempt: attempt}
	r.mu.Lock()
	r.lastActive = time.Now()
	r.mu.Unlock()

	// A job that may have been handled before (redelivered, re-published,
	// or from a resumed expansion) is checked against the ledger: one whose
	// send was accepted before a crash or a lost ack is acknowledged without
	// sending. A job on its first delivery straight from render cannot have
	// been sent, and skips the lookups (see sentIndex).
	le := &ledgerEntry{}
	if meta.NumDelivered > 1 || job.Attempts > 0 || job.Recheck {
		if sent, err := s.sent.sent(ctx, &job); err != nil {
			return fmt.Errorf("ledger: %w", err)
		} else if sent {
			log.Debug("job already sent (its sent event exists); not sending again")
			return nil
		}
		if le, err = s.readLedger(ctx, &job); err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		// A redelivery whose previous delivery left no outcome may follow
		// a send in flight when a process died: it may have been delivered.
		if meta.NumDelivered > 1 && !le.recorded(attempt-1) {
			job.MaybeSent = true
		}
		if le.State == "sent" {
			// Sent, but its event could not be published then: publish it now.
			log.Debug("job already sent; not sending again")
			return s.publish(ctx, &contract.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: le.Account,
				Kind: contract.EventSent, Attempt: le.Attempt, Index: job.Index, ProviderID: le.ProviderID, At: le.At})
		}
	}
	if done, err := r.mayStillSend(ctx, &job, attempt-1); done {
		return err
	}

	// Caps: a reached daily cap or a too-recent send to this recipient delays
	// the job without spending an attempt.
	var caps *capTracker
	if dailyCap, gap := channels.EffectiveDailyCap(acct), acct.PerRecipientInterval.D(); dailyCap > 0 || gap > 0 {
		if caps, err = r.capTracker(ctx); err != nil {
			return err
		}
		if adm := caps.admit(job.To, time.Now(), dailyCap, gap); !adm.ok {
			log.Debug("send delayed by caps", "code", adm.code, "reason", adm.reason, "wait", adm.wait)
			if adm.code == "daily_cap" {
				return r.capReached(ctx, &job, attempt-1, adm)
			}
			return s.delayJob(ctx, &job, acct.Name, attempt-1, adm.wait)
		}
	}

	var (
		res        channels.Result
		latency    time.Duration
		callShared bool
	)
	if batch := r.batch; batch != nil {
		// A batch account: the batcher merges this send with others of the
		// same text, paces calls, re-checks pause and cancel before each,
		// and notes each call's answer for adaptive pacing once.
		msg := channels.Message{ID: job.ID, TaskID: job.TaskID, To: job.To, Body: job.Body,
			Account: acct.Name, Attempt: attempt, Vars: job.Vars}
		o, handled, err := r.sendBatched(ctx, batch, &job, msg, attempt-1, caps)
		if handled {
			return err
		}
		res, latency, callShared = o.res, o.latency, o.callShared
		// Until this job is settled, the batcher expects its slot to bring
		// more jobs and keeps partial groups waiting.
		defer batch.settled()
	} else {
		// The replica's in-flight budget (Config.MaxInFlight) is taken before
		// the account's turn: taken after it, a slot freed late would start
		// sends together and bunch them beyond the account's rate.
		slot, err := s.takeInFlight(ctx)
		if err != nil {
			if caps != nil {
				caps.release(ctx, job.To, false, time.Now())
			}
			return shared.RetryAfter(0, err)
		}
		defer slot.free()

		for {
			granted, err := turn.wait(ctx, turnCheck)
			if granted {
				break
			}
			if err != nil {
				if caps != nil {
					caps.release(ctx, job.To, false, time.Now())
				}
				// Stopping, or the lease is gone: hand the job back at once for
				// whichever process sends for the account next (a delayed NAK
				// would hold one of the lane's MaxAckPending slots meanwhile,
				// and with all of them held the new owner would wait).
				delay := time.Second
				if errors.Is(err, errSchedStopped) || errors.Is(err, errLeaseLost) {
					delay = 0
				}
				return shared.RetryAfter(delay, err)
			}
			if done, err := r.mayStillSend(ctx, &job, attempt-1); done {
				if caps != nil {
					caps.release(ctx, job.To, false, time.Now())
				}
				return err
			}
		}
		// A pause or cancel that came while this job waited for a token wins:
		// no new send starts after it.
		if done, err := r.obeyControl(ctx, &job, attempt-1); done {
			if caps != nil {
				caps.release(ctx, job.To, false, time.Now())
			}
			return err
		}
		// The one-second bound is kept where the send starts (pacer.admit).
		start, err := r.pacer.admit(ctx)
		if err != nil {
			if caps != nil {
				caps.release(ctx, job.To, false, time.Now())
			}
			return shared.RetryAfter(0, err)
		}
		res = sender.Send(ctx, []channels.Message{{ID: job.ID, TaskID: job.TaskID, To: job.To, Body: job.Body,
			Account: acct.Name, Attempt: attempt, Vars: job.Vars}})[0]
		latency = time.Since(start)
		turn.sent() // the provider call is over: its in-flight slot is free
		slot.free()
		s.cfg.metrics.Latency(acct.Name, latency)
	}
	if caps != nil {
		// A send whose answer never came (the client gave up) may have
		// reached the recipient: it counts for the gap and the cap as sent,
		// so its retry waits the interval too.
		caps.release(ctx, job.To, res.OK() || res.Code == "timeout", time.Now())
	}
	ev := r.event(&job, contract.EventSent, attempt)
	ev.Code, ev.Error, ev.Class = res.Code, res.Err, res.Class
	ev.CallShared = callShared
	ev.LatencyMS = float64(latency.Microseconds()) / 1000

	if res.OK() {
		if r.batch == nil {
			r.noteSuccess() // a batch account counts calls (batcher.go)
		}
		ev.ProviderID = res.ProviderID
		return s.publishSent(&job, ev, log)
	}

	log = &jobLogger{l: log.get().With(shared.KeyClass, res.Class, "code", res.Code)}
	le.addAttempt(contract.AttemptError{Attempt: attempt, Account: acct.Name, Class: res.Class, Code: res.Code, Error: res.Err, At: time.Now().UTC()})
	if r.batch == nil {
		r.noteFailure(res, log)
	}

	if accountProblem(res) {
		// The account cannot send, the recipient is not at fault: the job
		// moves to a healthy account of its pool, or waits with the reason,
		// without spending an attempt, so an account's problem never sends
		// a recipient to DEAD.
		if err := s.writeLedger(ctx, &job, le); err != nil {
			log.Warn("could not record attempt error", "err", err)
		}
		ev.Kind = contract.EventRetrying
		if err := s.publish(ctx, ev); err != nil {
			return err
		}
		why := fmt.Sprintf("account %s answered %s: %s", acct.Name, res.Code, res.Err)
		if drain, reason := r.draining(); drain {
			why = reason
		}
		return r.reroute(ctx, &job, attempt-1, why)
	}
	if !res.Class.Retryable() || attempt >= job.MaxAttempts {
		reason := "permanent error"
		if res.Class.Retryable() {
			reason = fmt.Sprintf("gave up after %d attempts", attempt)
		}
		log.Warn("send failed; giving up", "reason", reason, "err", res.Err)
		return shared.Permanent(&giveUp{job: &job, attempt: attempt, account: acct.Name, class: res.Class, code: res.Code, err: res.Err, history: le.History, callShared: callShared})
	}

	delay := backoff(attempt, s.cfg.BackoffBase, s.cfg.BackoffMax)
	if res.Class == contract.ClassRateLimited || res.Class == contract.ClassRecipientDelay {
		delay = max(delay, res.RetryAfter)
	}
	if err := s.writeLedger(ctx, &job, le); err != nil {
		log.Warn("could not record attempt error", "err", err)
	}
	log.Info("send failed; will retry", "err", res.Err, "delay", delay)
	ev.Kind = contract.EventRetrying
	ev.RatePerSec, _ = r.pacer.effective()
	if err := s.publish(ctx, ev); err != nil {
		return err
	}
	if delay >= s.cfg.LongWait {
		return s.delayJob(ctx, &job, acct.Name, attempt, delay)
	}
	return shared.RetryAfter(delay, fmt.Errorf("%s: %s", res.Class, res.Err))
}

// sentEventTimeout bounds the wait for a sent event's ack, well within the
// job's ack wait.
const sentEventTimeout = 5 * time.Second

// publishSent stores a successful send's event, which is the record that
// stops a repeat (see sentIndex), and has the job acknowledged only once
// the event is stored. It does not wait for that: the consume loop does
// (shared.Later). If the event cannot be stored, the ledger entry says the
// job was sent, and the job comes back and publishes its event then.
func (s *Service) publishSent(job *contract.Job, ev *contract.Event, log *jobLogger) error {
	f, err := s.events.PublishEvent(s.ctx, ev)
	if err != nil {
		return s.sentNotStored(job, ev, err, log)
	}
	return shared.Later(func(ctx context.Context) error {
		// On a stop (ctx) the event may yet be stored, or not.
		if err := f.Wait(ctx); err != nil {
			return s.sentNotStored(job, ev, err, log)
		}
		s.cfg.metrics.Outcome(ev)
		return nil
	})
}

// sentNotStored records in the ledger that job was sent when its event
// could not be stored (or is not known to be), and returns the error that
// brings the job back.
func (s *Service) sentNotStored(job *contract.Job, ev *contract.Event, cause error, log *jobLogger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	entry := &ledgerEntry{State: "sent", Account: ev.Account, Attempt: ev.Attempt, ProviderID: ev.ProviderID, At: time.Now().UTC()}
	if err := s.writeLedger(ctx, job, entry); err != nil {
		log.Error("neither the sent event nor the ledger entry could be stored after a successful send; a redelivery may repeat it (same idempotency key)", "err", err)
	}
	return fmt.Errorf("publish %s event: %w", ev.Kind, cause)
}

// mayStillSend checks what may change while a job waits: its expiry, its
// task's run state and the account's health. done reports that the job was
// handled here (expired, cancelled, parked or moved), with err for the
// consume loop.
func (r *accountRunner) mayStillSend(ctx context.Context, job *contract.Job, attempts int) (done bool, err error) {
	if !job.ExpiresAt.IsZero() && time.Now().After(job.ExpiresAt) {
		ev := r.event(job, contract.EventExpired, attempts)
		ev.Code, ev.Error = "expired", "expires_at "+job.ExpiresAt.Format(time.RFC3339)+" passed before the send"
		if job.MaybeSent {
			ev.Error = "expires_at " + job.ExpiresAt.Format(time.RFC3339) + " passed before the answer to an earlier send was known"
		}
		return true, r.svc.publish(ctx, ev)
	}
	if done, err := r.obeyControl(ctx, job, attempts); done {
		return true, err
	}
	if drain, why := r.draining(); drain {
		return true, r.reroute(ctx, job, attempts, why)
	}
	return false, nil
}

// event starts an event about job with the account's effective rate.
func (r *accountRunner) event(job *contract.Job, kind contract.EventKind, attempt int) *contract.Event {
	rate, _ := r.pacer.effective()
	return &contract.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: r.name, Kind: kind,
		Attempt: attempt, Index: job.Index, RatePerSec: rate, Generation: job.Generation,
		MaybeSent: job.MaybeSent && kind != contract.EventSent}
}

// reroute moves a job off an account that must not send: to a healthy
// account of its pool, or, when there is none, back onto this account
// after a wait, with a retrying event saying why.
func (r *accountRunner) reroute(ctx context.Context, job *contract.Job, attempts int, why string) error {
	s := r.svc
	var candidates []*contract.Account
	for _, a := range s.health.Usable(s.accounts.ForTask(job.Channel, job.Pool)) {
		if a.Name != r.name {
			candidates = append(candidates, a)
		}
	}
	if to := shared.PickAccount(candidates, job.To, s.health); to != nil {
		r.log.Debug("job moved to a healthy account", shared.KeyJobID, job.ID, "to", to.Name, "why", why)
		return s.moveJob(ctx, job, to.Name, attempts)
	}
	ev := r.event(job, contract.EventRetrying, attempts)
	ev.Code, ev.Class = "no_healthy_account", contract.ClassAccountFatal
	ev.Error = why + "; no healthy " + job.Channel + " account to move to, waiting"
	if err := s.publish(ctx, ev); err != nil {
		return err
	}
	return s.holdJob(ctx, job, r.name, attempts, s.cfg.NoHealthyWait)
}

// capReached handles a job whose account reached its daily cap: it moves
// to an account of its pool that still has capacity (by the accounts'
// health values), or is held, with a retrying event saying why, until the
// window frees a slot or an account edit adds capacity (wake.go).
func (r *accountRunner) capReached(ctx context.Context, job *contract.Job, attempts int, adm admission) error {
	s := r.svc
	var candidates []*contract.Account
	for _, a := range s.health.Usable(s.accounts.ForTask(job.Channel, job.Pool)) {
		if a.Name != r.name && s.health.Get(a.Name).Remaining() != 0 {
			candidates = append(candidates, a)
		}
	}
	if to := shared.PickAccount(candidates, job.To, s.health); to != nil {
		r.log.Debug("job moved to an account with daily capacity left", shared.KeyJobID, job.ID, "to", to.Name)
		return s.moveJob(ctx, job, to.Name, attempts)
	}
	ev := r.event(job, contract.EventRetrying, attempts)
	ev.Code, ev.Error = adm.code, adm.reason
	if err := s.publish(ctx, ev); err != nil {
		return err
	}
	return s.holdJob(ctx, job, r.name, attempts, adm.wait)
}

// publish stores an event; failing to do so retries the job, so every
// outcome has its event.
func (s *Service) publish(ctx context.Context, ev *contract.Event) error {
	if err := shared.PublishEvent(ctx, s.js, ev); err != nil {
		return fmt.Errorf("publish %s event: %w", ev.Kind, err)
	}
	s.cfg.metrics.Outcome(ev)
	return nil
}

// jobLogger is a job's logger, built on first use: most jobs log nothing,
// and building it for each (slog.With) cost 4% of the benchmark's CPU.
type jobLogger struct {
	base    *slog.Logger
	job     *contract.Job
	attempt int
	l       *slog.Logger
}

func (j *jobLogger) get() *slog.Logger {
	if j.l == nil {
		j.l = j.base.With(shared.KeyTaskID, j.job.TaskID, shared.KeyJobID, j.job.ID, shared.KeyAttempt, j.attempt)
	}
	return j.l
}

func (j *jobLogger) Debug(msg string, args ...any) { j.get().Debug(msg, args...) }
func (j *jobLogger) Info(msg string, args ...any)  { j.get().Info(msg, args...) }
func (j *jobLogger) Warn(msg string, args ...any)  { j.get().Warn(msg, args...) }
func (j *jobLogger) Error(msg string, args ...any) { j.get().Error(msg, args...) }
