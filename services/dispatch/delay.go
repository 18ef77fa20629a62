package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// delayJob re-publishes d's job to come back after wait as a JetStream
// scheduled message (Nats-Schedule: @at), so the wait holds no
// MaxAckPending slot the way a NakWithDelay would. attempts is the attempt
// count the copy carries. The schedule subject is unique per job, so a
// repeated delay of the same job replaces its schedule instead of adding a
// second copy; the copy is a handoff (handoff.go), so a crash before the
// ack neither sends the original nor schedules it twice.
func (r *accountRunner) delayJob(ctx context.Context, d *delivery, account string, attempts int, wait time.Duration) error {
	return r.schedule(ctx, d, account, attempts, wait, "delay", contract.SubjectDelayPrefix+account+"."+d.job.ID)
}

// holdJob is delayJob for a job that waits for capacity (a reached daily
// cap, no healthy account): it is held on contract.HeldSubject, where an
// account edit that adds capacity wakes it before wait (wake.go).
func (r *accountRunner) holdJob(ctx context.Context, d *delivery, account string, attempts int, wait time.Duration) error {
	return r.schedule(ctx, d, account, attempts, wait, "hold", contract.HeldSubject(account, d.job.ID))
}

// schedule publishes d's job as a scheduled message on subject, due after
// wait.
func (r *accountRunner) schedule(ctx context.Context, d *delivery, account string, attempts int, wait time.Duration, action, subject string) error {
	job := &d.job
	cp := *job
	cp.Account = account
	cp.Attempts, cp.Recheck = attempts, true
	// Schedules have one-second resolution: round up so the job never comes
	// back before its time.
	at := time.Now().Add(wait).Truncate(time.Second).Add(time.Second)
	if !job.ExpiresAt.IsZero() && at.After(job.ExpiresAt) {
		// Come back when the job expires, to be marked expired then.
		at = job.ExpiresAt.Truncate(time.Second).Add(time.Second)
	}
	if err := r.handOff(ctx, d, action, subject, &cp, at, contract.JobSubject(account, job.Priority)); err != nil {
		return fmt.Errorf("schedule job for %s: %w", at.Format(time.RFC3339), err)
	}
	return nil
}

// moveJob hands d's job to another account now, as a handoff: a crash
// before the ack neither moves a second copy nor sends the original where
// it was.
func (r *accountRunner) moveJob(ctx context.Context, d *delivery, to string, attempts int) error {
	cp := d.job
	cp.Account = to
	cp.Attempts, cp.Recheck = attempts, true
	cp.Moves++
	return r.handOff(ctx, d, "move", contract.JobSubject(to, cp.Priority), &cp, time.Time{}, "")
}
