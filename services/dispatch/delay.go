package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// delayJob re-publishes job to come back after d as a JetStream scheduled
// message (Nats-Schedule: @at), so the wait holds no MaxAckPending slot the
// way a NakWithDelay would. attempts is the attempt count the copy carries.
// The schedule subject is unique per job, so a repeated delay of the same
// job replaces its schedule instead of adding a second copy.
func (s *Service) delayJob(ctx context.Context, job *contract.Job, account string, attempts int, d time.Duration) error {
	return s.schedule(ctx, job, account, attempts, d, contract.SubjectDelayPrefix+account+"."+job.ID)
}

// holdJob is delayJob for a job that waits for capacity (a reached daily
// cap, no healthy account): it is held on contract.HeldSubject, where an
// account edit that adds capacity wakes it before d (wake.go).
func (s *Service) holdJob(ctx context.Context, job *contract.Job, account string, attempts int, d time.Duration) error {
	return s.schedule(ctx, job, account, attempts, d, contract.HeldSubject(account, job.ID))
}

// schedule publishes job as a scheduled message on subject, due after d.
func (s *Service) schedule(ctx context.Context, job *contract.Job, account string, attempts int, d time.Duration, subject string) error {
	cp := *job
	cp.Account = account
	cp.Attempts, cp.Recheck = attempts, true
	data, err := json.Marshal(&cp)
	if err != nil {
		return err
	}
	// Schedules have one-second resolution: round up so the job never comes
	// back before its time.
	at := time.Now().Add(d).Truncate(time.Second).Add(time.Second)
	if !job.ExpiresAt.IsZero() && at.After(job.ExpiresAt) {
		// Come back when the job expires, to be marked expired then.
		at = job.ExpiresAt.Truncate(time.Second).Add(time.Second)
	}
	_, err = s.js.Publish(ctx, subject, data,
		jetstream.WithScheduleAt(at),
		jetstream.WithScheduleTarget(contract.JobSubject(account, job.Priority)))
	if err != nil {
		return fmt.Errorf("schedule job for %s: %w", at.Format(time.RFC3339), err)
	}
	return nil
}

// moveJob hands job to another account now.
func (s *Service) moveJob(ctx context.Context, job *contract.Job, to string, attempts int) error {
	cp := *job
	cp.Account = to
	cp.Attempts, cp.Recheck = attempts, true
	cp.Moves++
	data, err := json.Marshal(&cp)
	if err != nil {
		return err
	}
	_, err = s.js.Publish(ctx, contract.JobSubject(to, job.Priority), data,
		jetstream.WithMsgID(fmt.Sprintf("%s:to:%s:%d:m%d", job.MsgID(), to, attempts, cp.Moves)))
	return err
}
