package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/shared"
)

// handle takes one job through ledger check, expiry, pacing, the provider
// call and the outcome's event. It returns what the consume loop should do.
func (r *accountRunner) handle(ctx context.Context, msg jetstream.Msg) error {
	s := r.svc
	var job shared.Job
	if err := json.Unmarshal(msg.Data(), &job); err != nil {
		return shared.Permanent(&giveUp{class: shared.ClassPermanent, code: "bad_job", err: fmt.Sprintf("job does not decode: %v", err)})
	}
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	attempt := job.Attempts + int(meta.NumDelivered)
	acct, sender := r.current()
	log := s.log.With(shared.KeyTaskID, job.TaskID, shared.KeyJobID, job.ID, shared.KeyAccount, acct.Name, shared.KeyAttempt, attempt)

	// A job recorded as sent was accepted by the provider before a crash or a
	// lost ack: acknowledge it without sending, and make sure its event exists.
	if le, err := s.sentBefore(ctx, &job); err != nil {
		return fmt.Errorf("ledger: %w", err)
	} else if le != nil {
		log.Debug("job already sent; not sending again")
		return s.publish(ctx, &shared.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: le.Account,
			Kind: shared.EventSent, Attempt: le.Attempt, Index: job.Index, ProviderID: le.ProviderID, At: le.At})
	}

	if !job.ExpiresAt.IsZero() && time.Now().After(job.ExpiresAt) {
		return s.publish(ctx, &shared.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: acct.Name,
			Kind: shared.EventExpired, Attempt: attempt - 1, Index: job.Index, Code: "expired",
			Error: "expires_at " + job.ExpiresAt.Format(time.RFC3339) + " passed before the send"})
	}

	if err := r.limiter.Wait(ctx); err != nil {
		// Stopping: leave the job for redelivery without spending an attempt.
		return shared.RetryAfter(time.Second, err)
	}
	start := time.Now()
	res := sender.Send(ctx, []channels.Message{{ID: job.ID, TaskID: job.TaskID, To: job.To, Body: job.Body,
		Account: acct.Name, Attempt: attempt, Vars: job.Vars}})[0]
	latency := time.Since(start)
	ev := &shared.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: acct.Name, Attempt: attempt,
		Index: job.Index, Code: res.Code, Error: res.Err, Class: res.Class,
		RatePerSec: float64(r.limiter.Limit()), LatencyMS: float64(latency.Microseconds()) / 1000}

	if res.OK() {
		ev.Kind, ev.ProviderID = shared.EventSent, res.ProviderID
		if err := s.recordSent(ctx, &job, ledgerEntry{Account: acct.Name, Attempt: attempt, ProviderID: res.ProviderID, At: time.Now().UTC()}); err != nil {
			// The send happened; the event below still counts it. Only a
			// crash before the ack could now repeat it.
			log.Error("ledger write failed after a successful send", "err", err)
		}
		return s.publish(ctx, ev)
	}

	log = log.With(shared.KeyClass, res.Class, "code", res.Code)
	if !res.Class.Retryable() || attempt >= job.MaxAttempts {
		reason := "permanent error"
		if res.Class.Retryable() {
			reason = fmt.Sprintf("gave up after %d attempts", attempt)
		}
		log.Warn("send failed; giving up", "reason", reason, "err", res.Err)
		return shared.Permanent(&giveUp{job: &job, attempt: attempt, account: acct.Name, class: res.Class, code: res.Code, err: res.Err})
	}

	delay := backoff(attempt, s.cfg.BackoffBase, s.cfg.BackoffMax)
	switch res.Class {
	case shared.ClassRateLimited, shared.ClassRecipientDelay:
		if res.RetryAfter > delay {
			delay = res.RetryAfter
		}
	case shared.ClassAccountFatal:
		log.Error("account-fatal answer from provider; job held", "err", res.Err)
		delay = max(delay, s.cfg.AccountFatalDelay)
	}
	log.Info("send failed; will retry", "err", res.Err, "delay", delay)
	ev.Kind = shared.EventRetrying
	if err := s.publish(ctx, ev); err != nil {
		return err
	}
	return shared.RetryAfter(delay, fmt.Errorf("%s: %s", res.Class, res.Err))
}

// publish stores an event; failing to do so retries the job, so every
// outcome has its event.
func (s *Service) publish(ctx context.Context, ev *shared.Event) error {
	if err := shared.PublishEvent(ctx, s.js, ev); err != nil {
		return fmt.Errorf("publish %s event: %w", ev.Kind, err)
	}
	return nil
}
