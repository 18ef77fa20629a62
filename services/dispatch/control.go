package dispatch

import (
	"context"
	"encoding/json"

	"github.com/broadcastd/broadcast/contract"
)

// obeyControl applies the task's run state to a job about to be sent: a
// cancelled task's job becomes cancelled; a paused, scheduled or
// not-yet-approved task's job is parked on broadcast.parked.<task>.<account>
// (test recipients excepted) until ingest re-queues it on resume. done
// reports whether the job was handled here.
func (r *accountRunner) obeyControl(ctx context.Context, job *contract.Job, attempts int) (done bool, err error) {
	ctl := r.svc.controls.Get(job.TaskID)
	switch {
	case ctl.State == contract.StateCancelled:
		ev := r.event(job, contract.EventCancelled, attempts)
		ev.Code, ev.Error = "cancelled", "task cancelled"
		return true, r.svc.publish(ctx, ev)
	case controlLets(ctl, job):
		return false, nil
	}
	cp := *job
	cp.Attempts, cp.Recheck = attempts, true
	data, err := json.Marshal(&cp)
	if err != nil {
		return true, err
	}
	_, err = r.svc.js.Publish(ctx, contract.ParkedSubject(job.TaskID, job.Account), data)
	return true, err
}

// controlLets reports whether the task's run state lets job be sent now:
// exactly the jobs obeyControl leaves alone.
func controlLets(ctl contract.Control, job *contract.Job) bool {
	return ctl.Sends() || job.Test && ctl.State == contract.StateAwaitingApproval
}
