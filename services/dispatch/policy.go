package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/shared"
)

// obeyPolicy applies the recipient policy of the job's channel (KV
// broadcast_policy, internal/policy) right before the account's caps: a
// recipient inside its quiet hours waits until they end, re-published for
// then without spending an attempt or holding a slot, with a retrying
// event coded quiet_hours; one over a frequency cap is skipped, coded
// frequency_cap; otherwise the send is reserved under the caps, by job id,
// and released again by send if the call did not reach the recipient.
// Transactional jobs and test sends bypass both and are not counted. A
// digest's carrier has been through the policy in carry (digest.go), item
// by item, with one reservation for the digest. done reports that the job
// was handled here, with err for the consume loop.
func (r *accountRunner) obeyPolicy(ctx context.Context, d *delivery) (done bool, err error) {
	job := &d.job
	cat := job.JobCategory()
	if cat == contract.CategoryTransactional || d.digest != nil {
		return false, nil
	}
	p := r.svc.policy.For(job.Channel)
	if p == nil {
		return false, nil
	}
	if job.Test {
		// A test recipient (the task's test_recipients, sent before it is
		// approved) is someone checking the message: neither held nor
		// skipped, nor counted against their caps. The suppression list
		// was checked before (mayStillSend) and still applies.
		return false, nil
	}
	now := r.svc.cfg.Now()
	if q := quietHoursOf(p, cat); q != nil {
		loc, from := policy.Zone(job.Vars, job.TaskTZ, job.To, q.DefaultLocation())
		if end, inside := q.Until(now, loc); inside {
			wait := end.Sub(now)
			ev := r.event(d, contract.EventRetrying, d.attempt-1)
			ev.Code = contract.CodeQuietHours
			ev.Error = fmt.Sprintf("quiet hours %s-%s in the recipient's zone %s (from %s); waiting until %s",
				q.Start, q.End, loc, from, end.Format(time.RFC3339))
			if err := r.svc.publish(ctx, ev); err != nil {
				return true, err
			}
			d.log.Debug("job held for quiet hours", "zone", loc.String(), "wait", wait)
			return true, r.delayJob(ctx, d, r.name, d.attempt-1, wait)
		}
	}
	if !anyCapApplies(p.FrequencyCaps, cat) {
		return false, nil
	}
	over, err := r.svc.frequency.Reserve(ctx, job.Channel, job.To, job.ID, cat, p.FrequencyCaps, now)
	if err != nil {
		return true, shared.RetryAfter(time.Second, err)
	}
	if over != nil {
		// Like a suppressed recipient: never attempted.
		d.log.Debug("job skipped by a frequency cap", "cap", over.Explain())
		ev := r.event(d, contract.EventSkipped, d.attempt-1)
		ev.Code, ev.Error, ev.Class = contract.CodeFrequencyCap, over.Explain(), contract.ClassPermanent
		return true, r.svc.publish(ctx, ev)
	}
	d.frequencyReserved = true
	return false, nil
}

// quietHoursOf is p's quiet hours when they hold messages of cat, else nil.
func quietHoursOf(p *contract.Policy, cat contract.Category) *contract.QuietHours {
	if q := p.QuietHours; q != nil && q.Applies(cat) {
		return q
	}
	return nil
}

// inQuietHours reports whether job's recipient is inside p's quiet hours
// for the job's category at now.
func inQuietHours(p *contract.Policy, job *contract.Job, now time.Time) bool {
	q := quietHoursOf(p, job.JobCategory())
	if q == nil {
		return false
	}
	loc, _ := policy.Zone(job.Vars, job.TaskTZ, job.To, q.DefaultLocation())
	_, inside := q.Until(now, loc)
	return inside
}

// policyStops reports whether the policy would hold or skip job if it
// were sent alone now (obeyPolicy). A job with a digest_key checks it
// before it joins a digest, so one that must wait or be skipped meets the
// policy alone, and one back from its wait may merge then.
func (r *accountRunner) policyStops(ctx context.Context, job *contract.Job) (bool, error) {
	p := r.svc.policy.For(job.Channel)
	if p == nil {
		return false, nil
	}
	var usage *policy.Usage
	if anyCapApplies(p.FrequencyCaps, job.JobCategory()) {
		var err error
		if usage, err = r.svc.frequency.Load(ctx, job.Channel, job.To); err != nil {
			return false, err
		}
	}
	return policyHolds(p, usage, job, job.ID, r.svc.cfg.Now()), nil
}

// policyHolds reports whether policy p would hold job (quiet hours) or
// skip it (a frequency cap without room, by usage, its recipient's
// reserved sends) if it were sent alone at now. The reservations of own
// and of the job itself do not count: they are the message's own, which
// a reservation reuses. usage may be nil when no cap applies.
func policyHolds(p *contract.Policy, usage *policy.Usage, job *contract.Job, own string, now time.Time) bool {
	cat := job.JobCategory()
	if cat == contract.CategoryTransactional {
		return false
	}
	if inQuietHours(p, job, now) {
		return true
	}
	return usage != nil && anyCapApplies(p.FrequencyCaps, cat) && usage.Check(cat, p.FrequencyCaps, now, own, job.ID) != nil
}

func anyCapApplies(caps []contract.FrequencyCap, cat contract.Category) bool {
	for i := range caps {
		if caps[i].Applies(cat) {
			return true
		}
	}
	return false
}

// frequencyReleaseTimeout bounds the release of a reservation, which runs
// also while the service stops (a release that does not happen leaves the
// reservation to the job's next delivery, which reuses it).
const frequencyReleaseTimeout = 5 * time.Second

// releaseFrequency drops d's frequency reservation unless its send may
// have reached the recipient (accepted or unanswered): a retry reserves
// again, and a job cancelled or expired while it waited stops counting.
func (r *accountRunner) releaseFrequency(_ context.Context, d *delivery, o *sendOutcome) {
	if o != nil && o.mayHaveReached() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), frequencyReleaseTimeout)
	defer cancel()
	if err := r.svc.frequency.Release(ctx, d.job.Channel, d.job.To, d.job.ID); err != nil {
		d.log.Warn("could not release the frequency cap reservation of an unsent job; it counts until its window passes", "err", err)
	}
}
