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
// broadcast_policy, internal/policy) before the account's caps: a
// recipient inside its quiet hours waits until they end, re-published for
// then without spending an attempt or holding a slot, with a retrying
// event coded quiet_hours; one over a frequency cap is skipped, coded
// frequency_cap. With reserve the send is then reserved under the caps,
// by job id, and released again by send if the call did not reach the
// recipient; without it the caps are only read, and reserveFrequency
// reserves once the account's caps have admitted the send, so a job that
// waits for them (a per-recipient interval, a daily cap) holds no
// reservation meanwhile. Transactional jobs and test sends bypass both
// and are not counted. A digest's carrier has been through the policy in
// carry (digest.go), item by item, with one reservation for the digest.
// done reports that the job was handled here, with err for the consume
// loop.
func (r *accountRunner) obeyPolicy(ctx context.Context, d *delivery, reserve bool) (done bool, err error) {
	p := r.policyOf(d)
	if p == nil {
		return false, nil
	}
	job := &d.job
	cat := job.JobCategory()
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
	if reserve {
		return r.reserveFrequency(ctx, d)
	}
	usage, err := r.svc.frequency.Load(ctx, job.Channel, job.To)
	if err != nil {
		return true, shared.RetryAfter(time.Second, err)
	}
	if over := usage.Check(cat, p.FrequencyCaps, now, job.ID); over != nil {
		return true, r.skipOverCap(ctx, d, over)
	}
	return false, nil
}

// policyOf is the policy that applies to d's job, nil when none does: no
// policy for its channel, a transactional job, a test send (the task's
// test_recipients, sent before it is approved: someone checking the
// message, neither held nor skipped, nor counted against their caps; the
// suppression list was checked before, in mayStillSend, and still
// applies) or a digest's carrier.
func (r *accountRunner) policyOf(d *delivery) *contract.Policy {
	job := &d.job
	if job.JobCategory() == contract.CategoryTransactional || d.digest != nil || job.Test {
		return nil
	}
	return r.svc.policy.For(job.Channel)
}

// reserveFrequency reserves d's send under the frequency caps of its
// channel's policy, or skips the job when a cap has no room left. done
// reports that the job was handled here, with err for the consume loop.
func (r *accountRunner) reserveFrequency(ctx context.Context, d *delivery) (done bool, err error) {
	p := r.policyOf(d)
	job := &d.job
	cat := job.JobCategory()
	if p == nil || !anyCapApplies(p.FrequencyCaps, cat) {
		return false, nil
	}
	over, err := r.svc.frequency.Reserve(ctx, job.Channel, job.To, job.ID, cat, p.FrequencyCaps, r.svc.cfg.Now())
	if err != nil {
		return true, shared.RetryAfter(time.Second, err)
	}
	if over != nil {
		return true, r.skipOverCap(ctx, d, over)
	}
	d.frequencyReserved = true
	return false, nil
}

// skipOverCap skips d's job for a frequency cap without room: like a
// suppressed recipient, never attempted.
func (r *accountRunner) skipOverCap(ctx context.Context, d *delivery, over *policy.Over) error {
	d.log.Debug("job skipped by a frequency cap", "cap", over.Explain())
	ev := r.event(d, contract.EventSkipped, d.attempt-1)
	ev.Code, ev.Error, ev.Class = contract.CodeFrequencyCap, over.Explain(), contract.ClassPermanent
	return r.svc.publish(ctx, ev)
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

// releaseEarlierFrequency drops the frequency reservation an earlier
// delivery of d's job may have left, when this one ends the job without a
// send (expired, cancelled, suppressed): a job reserves before the
// account's caps, and one that then waited (a per-recipient interval, a
// daily cap, a pause, a move) keeps its reservation for when it comes
// back (docs/policy.md, rule 2). One whose earlier send may have reached
// the recipient keeps it (releaseFrequency). A reservation of this
// delivery's own is send's to release.
func (r *accountRunner) releaseEarlierFrequency(d *delivery) {
	job := &d.job
	if d.frequencyReserved || job.Test || !(job.Recheck || d.redelivered || d.recheck) {
		return
	}
	if p := r.svc.policy.For(job.Channel); p == nil || d.digest == nil && !anyCapApplies(p.FrequencyCaps, job.JobCategory()) {
		return
	}
	r.releaseFrequency(context.Background(), d, nil)
}

// frequencyReleaseTimeout bounds the release of a reservation, which runs
// also while the service stops (a release that does not happen leaves the
// reservation to the job's next delivery, which reuses it).
const frequencyReleaseTimeout = 5 * time.Second

// releaseFrequency drops d's frequency reservation unless a send of its
// job may have reached the recipient: this one (accepted or unanswered),
// an earlier attempt that timed out (its ledger entry, read by sentBefore)
// or one whose answer a dead process lost (Job.MaybeSent). A retry
// reserves again, and a job cancelled or expired while it waited stops
// counting; one whose message may be out counts until its window passes.
func (r *accountRunner) releaseFrequency(_ context.Context, d *delivery, o *sendOutcome) {
	if o != nil && o.mayHaveReached() || d.job.MaybeSent || d.entry.mayHaveReached() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), frequencyReleaseTimeout)
	defer cancel()
	if err := r.svc.frequency.Release(ctx, d.job.Channel, d.job.To, d.job.ID); err != nil {
		d.log.Warn("could not release the frequency cap reservation of an unsent job; it counts until its window passes", "err", err)
	}
}
