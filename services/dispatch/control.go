package dispatch

import (
	"context"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// obeyControl applies the task's run state to a job about to be sent: a
// cancelled task's job becomes cancelled; a paused, scheduled or
// not-yet-approved task's job is parked on broadcast.parked.<task>.<account>
// (test recipients excepted) until ingest re-queues it on resume. done
// reports whether the job was handled here.
func (r *accountRunner) obeyControl(ctx context.Context, d *delivery) (done bool, err error) {
	job := &d.job
	ctl := r.svc.controls.Get(job.TaskID)
	if !controlLets(ctl, job) {
		// Stopped only on the bucket's word: a view that lags (its watch
		// fell behind under load) would park the unparked jobs of a
		// resumed task again, and again after each sweep.
		var err error
		if ctl, err = r.svc.controls.Read(ctx, job.TaskID); err != nil {
			return true, shared.RetryAfter(time.Second, err)
		}
	}
	switch {
	case ctl.State == contract.StateCancelled:
		ev := r.event(d, contract.EventCancelled, d.attempt-1)
		ev.Code, ev.Error = "cancelled", "task cancelled"
		r.releaseEarlierFrequency(d)
		return true, r.svc.publish(ctx, ev)
	case controlLets(ctl, job):
		return false, nil
	}
	cp := *job
	cp.Attempts, cp.Recheck = d.attempt-1, true
	// Recorded and deduplicated by this message (handoff.go): a crash
	// before the ack must not leave two parked copies.
	return true, r.handOff(ctx, d, "park", contract.ParkedSubject(job.TaskID, job.Account), &cp, time.Time{}, "")
}

// controlLets reports whether the task's run state lets job be sent now:
// exactly the jobs obeyControl leaves alone.
func controlLets(ctl contract.Control, job *contract.Job) bool {
	return ctl.Sends() || job.Test && ctl.State == contract.StateAwaitingApproval
}
