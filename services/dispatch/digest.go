package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/shared"
)

// A digest merges the jobs of several tasks to one recipient (same
// channel, same digest_key) into one provider message. Its state is one
// entry of KV broadcast_ledger, key dg=<channel>.<hash of the recipient>.<hash
// of the digest key> (hashes, never raw recipients), changed only by
// compare-and-set on its revision:
//
//   - The first job opens it (Create) as its carrier and schedules itself
//     (a handoff, delay.go) for the end of the window, holding no slot.
//   - Later jobs join it (Update) and are acknowledged: the carrier is
//     responsible for them from then on.
//   - A job the recipient policy would hold or skip now (quiet hours, a
//     full frequency cap) does not join: it meets the policy alone.
//   - The carrier, due, takes out the items whose tasks cannot send now
//     and those the policy would hold or skip if each were sent alone now
//     (named in the entry's Out first, then re-published as handoffs of
//     the messages that joined: the former alone, so their own pause,
//     cancel or expiry applies; the latter to meet the policy alone and
//     merge again once it lets them), seals the entry, reserves one send
//     under the frequency caps by its own job id, renders the digest and
//     sends it like any job.
//   - Sent, it records that in the entry first, then publishes one sent
//     event per item (each deduplicated by its Nats-Msg-Id), then deletes
//     the entry. Whoever finds a sent entry (the carrier's redelivery, or
//     the next job to that recipient and key) publishes its events again
//     and deletes it.
//   - A carrier whose own task cannot send when due, or that the policy
//     would hold or skip, hands the duty to the next item: its job is
//     re-published as a scheduled carrier copy before the entry names it.
//     So does a carrier about to be held on its account (unhealthy, or
//     at its daily cap, with no account of its pool to move to): the
//     next item's pool may have one.
//
//   - Before each call the carrier names the attempt in the entry
//     (SendKey, its job id, and SendBody), and forgets it after an answer
//     that says the call did not reach the recipient. While one is named,
//     whoever carries the digest sends that text under that key, taking
//     no item out; a stopped carrier stays an item; a carrier giving up
//     hands the digest on rather than release the items.
//
// So a crash between any two steps loses no item and sends none twice,
// except that a kill during the provider call repeats it with the same
// Idempotency-Key and text, as for any job.

const (
	digestOpen   = "open"
	digestSealed = "sealed"
	digestSent   = "sent"
	// digestCASTries bounds the compare-and-set retries of one delivery
	// before it comes back later.
	digestCASTries = 20
)

// digestEntry is a digest's state in the ledger bucket.
type digestEntry struct {
	State string `json:"state"`
	// Carrier is the id of the job that sends the digest.
	Carrier  string    `json:"carrier"`
	ClosesAt time.Time `json:"closes_at"`
	// Template is the carrier's task's digest_template: the first task's
	// wins (a hand-over keeps it).
	Template string         `json:"template,omitempty"`
	Items    []contract.Job `json:"items"`
	// Seqs maps an item's job id to the stream sequence of the JOBS
	// message that joined: an item re-published later (taken out, handed
	// the duty, released) is recorded as that message's handoff, so its
	// redelivery after a crash before its ack publishes no second copy.
	Seqs map[string]uint64 `json:"seqs,omitempty"`
	// Out are items taken out (their tasks could not send when the digest
	// was due, the policy would not let them, or the digest was given up
	// on) whose jobs of their own are still to be published, marked
	// NoDigest when they are to be sent alone: the entry names them before
	// they are published and forgets them after, so a crash in between
	// publishes them again (deduplicated) and none is lost or published
	// twice.
	Out []contract.Job `json:"out,omitempty"`
	// SendKey and SendBody are the Idempotency-Key (the job id of the
	// carrier that made it) and the text of the digest's attempt in
	// progress, or of its last attempt that may have reached the
	// recipient (a timeout, or a process killed during the call): the
	// carrier records them before its call and forgets them after an
	// answer that says the call did not reach the recipient. While they
	// are set, every carrier sends them as they are, taking no item out:
	// the provider's idempotency then stores the message once, whoever
	// carries it.
	SendKey  string `json:"send_key,omitempty"`
	SendBody string `json:"send_body,omitempty"`
	// Set once the provider accepted the digest.
	Account    string    `json:"account,omitempty"`
	Attempt    int       `json:"attempt,omitempty"`
	ProviderID string    `json:"provider_id,omitempty"`
	SentAt     time.Time `json:"sent_at,omitzero"`
	LatencyMS  float64   `json:"latency_ms,omitempty"`
	// CallStartedAt is when the call that sent it began: every item's
	// sent event tells it (contract.Event.CallStartedAt).
	CallStartedAt time.Time `json:"call_started_at,omitzero"`
}

// has reports whether the digest holds the job with id.
func (e *digestEntry) has(id string) bool {
	is := func(j contract.Job) bool { return j.ID == id }
	return slices.ContainsFunc(e.Items, is) || slices.ContainsFunc(e.Out, is)
}

// sealedDigest is the digest a carrier's delivery is sending.
type sealedDigest struct {
	key   string
	entry *digestEntry
	rev   uint64
}

// digestKey is the ledger key of job's digest.
func digestKey(job *contract.Job) string {
	return "dg=" + job.Channel + "." + contract.DigestHash(job.To) + "." + contract.DigestHash(job.DigestKey)
}

// digest routes a job with a digest_key: it joins or opens its digest (and
// is done), carries a due digest (and goes on to be sent with the
// digest's text, d.digest set), finishes a digest sent before a crash, or
// is sent alone (done false). It runs after sentBefore and before
// mayStillSend, which it applies itself to a job about to join.
func (r *accountRunner) digest(ctx context.Context, d *delivery) (done bool, err error) {
	job := &d.job
	if job.DigestKey == "" || job.NoDigest || job.Test {
		return false, nil
	}
	s, key := r.svc, digestKey(job)
	policyChecked := false
	for range digestCASTries {
		e, rev, err := s.readDigest(ctx, key)
		if err != nil {
			return true, shared.RetryAfter(time.Second, fmt.Errorf("digest entry: %w", err))
		}
		switch {
		case e != nil && e.State == digestSent:
			if err := s.finishDigest(ctx, key, e, rev); err != nil {
				return true, shared.RetryAfter(time.Second, err)
			}
			if e.has(job.ID) {
				return true, nil // its sent event is stored now
			}
			continue
		case e != nil && e.Carrier == job.ID:
			done, retry, err := r.carry(ctx, d, key, e, rev)
			if retry {
				continue
			}
			return done, err
		case e != nil && e.has(job.ID):
			if job.DigestCarrier {
				// Handed the duty before the entry names it (or a stale
				// copy): come back once the entry settled.
				return true, r.digestWait(ctx, d)
			}
			if d.seq != e.Seqs[job.ID] && slices.ContainsFunc(e.Out, func(it contract.Job) bool { return it.ID == job.ID }) {
				// Its copy taken out, come before the entry forgot it:
				// come back once it has.
				d.log.Debug("taken out of a digest that still names it; waiting")
				return true, r.digestWait(ctx, d)
			}
			return true, nil // joined before a crash kept this message
		}
		window := r.digestWindow(ctx, d)
		if window <= 0 {
			job.DigestCarrier = false
			return false, nil
		}
		if done, err := r.mayStillSend(ctx, d); done {
			return true, err
		}
		if !policyChecked {
			// One the policy would hold or skip now meets it alone; back
			// from a wait, it may merge then.
			stop, err := r.policyStops(ctx, job)
			if err != nil {
				return true, shared.RetryAfter(time.Second, fmt.Errorf("policy: %w", err))
			}
			if stop {
				d.log.Debug("not joining a digest: the policy would hold or skip the job now")
				job.DigestCarrier = false
				return false, nil
			}
			policyChecked = true
		}
		now := time.Now().UTC()
		switch {
		case e == nil:
			ne := &digestEntry{State: digestOpen, Carrier: job.ID, ClosesAt: now.Add(window), Template: job.DigestTemplate,
				Items: []contract.Job{digestItem(job)}, Seqs: map[string]uint64{job.ID: d.seq}}
			if _, err := s.createDigest(ctx, key, ne); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			} else if err != nil {
				return true, shared.RetryAfter(time.Second, fmt.Errorf("open digest: %w", err))
			}
			d.log.Debug("digest opened", "closes_at", ne.ClosesAt)
			return true, r.scheduleCarrier(ctx, d, window)
		case e.State == digestOpen && len(e.Items) < contract.MaxDigestItems:
			e.Items = append(e.Items, digestItem(job))
			if e.Seqs == nil {
				e.Seqs = map[string]uint64{}
			}
			e.Seqs[job.ID] = d.seq
			if _, err := s.updateDigest(ctx, key, e, rev); isConflict(err) {
				continue
			} else if err != nil {
				return true, shared.RetryAfter(time.Second, fmt.Errorf("join digest: %w", err))
			}
			d.log.Debug("joined digest", "carrier", e.Carrier)
			return true, nil
		default:
			// Sealed (being sent) or full: the next digest opens once
			// this one is sent.
			return true, r.digestWait(ctx, d)
		}
	}
	return true, r.digestWait(ctx, d)
}

// digestWait has a job that cannot join or open its digest yet (the
// digest is being sent, is full, or its entry changed under every
// compare-and-set) come back in a second, as a scheduled copy: a delayed
// NAK would hold a slot and count a delivery, which numbers attempts.
func (r *accountRunner) digestWait(ctx context.Context, d *delivery) error {
	return r.delayJob(ctx, d, r.name, d.attempt-1, time.Second)
}

// digestWindow is how long job's digest gathers: the task's digest_window,
// else Config.DigestWindow while the account's backlog is above its
// digest_backlog, else 0 (sent alone).
//
// The backlog is the normal lane's jobs not yet acknowledged. For a job
// of that lane it is the count its own delivery carries (d.queued), as
// current as the delivery and free: a depth looked up once and kept for
// a second sent a whole burst alone when it was read at the burst's
// first job, and merged the jobs after a backlog drained. A job of the
// high or low lane adds its own lane's count to the normal lane's,
// looked up at most once a second (backlogs).
func (r *accountRunner) digestWindow(ctx context.Context, d *delivery) time.Duration {
	if w := d.job.DigestWindow.D(); w > 0 {
		return w
	}
	limit := d.acct.DigestBacklog
	if limit <= 0 {
		return 0
	}
	n := d.queued
	if n <= limit && (d.lane != laneNormal || d.queued == 0) {
		normal, ok := r.svc.backlogs.get(ctx, r.svc.js, d.acct.Name)
		if !ok {
			return 0
		}
		n += normal
	}
	if n > limit {
		return r.svc.cfg.DigestWindow
	}
	return 0
}

// digestItem is job as a digest keeps it: the job itself, so an item
// taken out can be re-published, without the digest's own marks.
func digestItem(job *contract.Job) contract.Job {
	it := *job
	it.DigestCarrier, it.Recheck = false, true
	return it
}

// scheduleCarrier has the carrier's job come back when the window closes,
// as a scheduled copy marked DigestCarrier.
func (r *accountRunner) scheduleCarrier(ctx context.Context, d *delivery, wait time.Duration) error {
	d.job.DigestCarrier = true
	return r.schedule(ctx, d, r.name, d.attempt-1, wait, "digest", contract.SubjectDelayPrefix+r.name+"."+d.job.ID)
}

// carry handles the digest's carrier: early, it waits for the window's
// end; stopped by its own task, it hands the duty on; due, it takes out
// the items that cannot go in the digest now (takeOut), seals the digest,
// reserves its send under the frequency caps and goes on to send it (done
// false, d.digest set). retry asks the caller to read the entry again (it
// changed under a compare-and-set, or another send took the caps' room).
func (r *accountRunner) carry(ctx context.Context, d *delivery, key string, e *digestEntry, rev uint64) (done, retry bool, err error) {
	s, job := r.svc, &d.job
	if r.carrierStopped(job) {
		return r.handOverDigest(ctx, d, key, e, rev, true, e.SendKey != "")
	}
	sealing := e.State == digestOpen
	if sealing {
		if wait := time.Until(e.ClosesAt); wait > 0 {
			return true, false, r.scheduleCarrier(ctx, d, wait)
		}
	}
	// The policy is checked when the digest is sealed and on every later
	// delivery of its carrier (back from a wait, a retry), as a lone job's
	// is before each send; but not once an attempt of the digest may have
	// reached the recipient, as taking items out then could send them
	// twice: it is sent again as it is.
	checkPolicy := e.SendKey == "" && (sealing || d.digestChecked || !d.entry.mayHaveReached() && !job.MaybeSent)
	n := len(e.Items)
	if checkPolicy {
		d.digestChecked = true
		held, err := r.takeOut(ctx, d, e, sealing)
		if err != nil {
			return true, false, shared.RetryAfter(time.Second, fmt.Errorf("digest policy: %w", err))
		}
		if held {
			if len(e.Items) != n {
				// The entry names the items taken out before anyone
				// publishes them.
				nrev, err := s.updateDigest(ctx, key, e, rev)
				if isConflict(err) {
					return false, true, nil
				} else if err != nil {
					return true, false, shared.RetryAfter(time.Second, fmt.Errorf("take items out of digest: %w", err))
				}
				rev = nrev
			}
			return r.handOverDigest(ctx, d, key, e, rev, false, false)
		}
	}
	if sealing || len(e.Items) != n {
		e.State = digestSealed
		nrev, err := s.updateDigest(ctx, key, e, rev)
		if isConflict(err) {
			return false, true, nil
		} else if err != nil {
			return true, false, shared.RetryAfter(time.Second, fmt.Errorf("seal digest: %w", err))
		}
		rev = nrev
	}
	if len(e.Out) > 0 {
		nrev, err := s.publishOut(ctx, key, e, rev)
		if isConflict(err) {
			return false, true, nil
		} else if err != nil {
			return true, false, shared.RetryAfter(time.Second, err)
		}
		rev = nrev
	}
	if done, retry, err := r.reserveDigest(ctx, d, e, checkPolicy); done || retry {
		return done, retry, err
	}
	if e.SendKey == "" {
		body, err := contract.RenderDigest(e.Template, digestItems(e), job.To)
		if err != nil {
			// Checked at intake; a limit hit on a large digest falls back
			// to the plain list rather than losing every item.
			d.log.Warn("digest template failed; sending the items one a line", "err", err)
			body, _ = contract.RenderDigest("", digestItems(e), job.To)
		}
		// Named before the call: a call that may reach the recipient
		// (even one cut by a crash) is repeated as it is, by whoever
		// carries the digest next.
		e.SendKey, e.SendBody = job.ID, body
		nrev, err := s.updateDigest(ctx, key, e, rev)
		if isConflict(err) {
			return false, true, nil
		} else if err != nil {
			return true, false, shared.RetryAfter(time.Second, fmt.Errorf("record the digest's attempt: %w", err))
		}
		rev, d.digestNamed = nrev, true
	} else if e.SendKey != job.ID {
		d.log.Debug("sending a digest again as an earlier carrier sent it", "idempotency_key", e.SendKey)
	}
	d.sendBody, d.sendKey = e.SendBody, e.SendKey
	d.digest = &sealedDigest{key: key, entry: e, rev: rev}
	return false, false, nil
}

// takeOut moves to e.Out the items, other than the carrier, that cannot
// go in the digest now, and reports whether the policy would hold or skip
// the carrier itself (held). With stopped (when sealing), items whose
// tasks stop them (carrierStopped) leave to be sent alone (NoDigest), so
// their own pause, cancel or expiry applies. Items the recipient policy
// would hold (quiet hours) or skip (a frequency cap without room) if each
// were sent alone now leave too, not marked: they meet the policy alone
// and may merge again once it lets them. So does an item holding a
// frequency reservation of its own (it reserved alone earlier, and that
// send may have reached the recipient), which reuses it sent alone. The
// digest's own reservation, by the carrier's job id, counts for none.
func (r *accountRunner) takeOut(ctx context.Context, d *delivery, e *digestEntry, stopped bool) (held bool, err error) {
	if len(e.Items) == 0 {
		return false, nil
	}
	s, first, carrier := r.svc, &e.Items[0], d.job.ID
	p := s.policy.For(first.Channel)
	var usage *policy.Usage
	if p != nil && slices.ContainsFunc(e.Items, func(it contract.Job) bool { return anyCapApplies(p.FrequencyCaps, it.JobCategory()) }) {
		if usage, err = s.frequency.Load(ctx, first.Channel, first.To); err != nil {
			return false, err
		}
	}
	now := s.cfg.Now()
	keep := e.Items[:0:0]
	for _, it := range e.Items {
		why := ""
		switch {
		case it.ID != carrier && stopped && r.carrierStopped(&it):
			it.NoDigest, why = true, "its task stops it"
		case it.ID != carrier && usage != nil && usage.Holds(it.ID):
			it.NoDigest, why = true, "it holds a frequency reservation of its own"
		case p != nil && policyHolds(p, usage, &it, carrier, now):
			if it.ID == carrier {
				d.log.Debug("the policy would hold or skip the digest's carrier")
				held = true
				keep = append(keep, it)
				continue
			}
			why = "the policy would hold or skip it"
		default:
			keep = append(keep, it)
			continue
		}
		d.log.Debug("item taken out of the digest", "item", it.ID, "why", why)
		e.Out = append(e.Out, it)
	}
	e.Items = keep
	return held, nil
}

// reserveDigest reserves the digest's send under the policy's frequency
// caps: one send, by the carrier's job id (a redelivery reuses it), for
// every category its items carry (digestCategories). When another send
// took the room since the items were checked, retry has carry check them
// again. A digest sent again as it is (checked false: an attempt may have
// reached the recipient) goes on without a reservation when the caps are
// full.
func (r *accountRunner) reserveDigest(ctx context.Context, d *delivery, e *digestEntry, checked bool) (done, retry bool, err error) {
	job := &d.job
	p := r.svc.policy.For(job.Channel)
	if p == nil {
		return false, false, nil
	}
	cats := digestCategories(e)
	if !slices.ContainsFunc(cats, func(c contract.Category) bool { return anyCapApplies(p.FrequencyCaps, c) }) {
		return false, false, nil
	}
	over, err := r.svc.frequency.ReserveMessage(ctx, job.Channel, job.To, job.ID, cats, p.FrequencyCaps, r.svc.cfg.Now())
	if err != nil {
		return true, false, shared.RetryAfter(time.Second, fmt.Errorf("reserve digest: %w", err))
	}
	if over != nil {
		if checked {
			return false, true, nil
		}
		d.log.Warn("a digest that may have reached the recipient is sent again without a frequency reservation", "cap", over.Explain())
		return false, false, nil
	}
	d.frequencyReserved = true
	return false, false, nil
}

// digestCategories are the categories of e's items the policy may limit
// (all but transactional), the strictest first: the digest's one send
// counts under every cap that limits any of them.
func digestCategories(e *digestEntry) []contract.Category {
	var cats []contract.Category
	for _, c := range contract.Categories {
		if c != contract.CategoryTransactional && slices.ContainsFunc(e.Items, func(it contract.Job) bool { return it.JobCategory() == c }) {
			cats = append(cats, c)
		}
	}
	return cats
}

// digestItems is what the digest template sees of e's items.
func digestItems(e *digestEntry) []contract.DigestItem {
	items := make([]contract.DigestItem, len(e.Items))
	for i, it := range e.Items {
		items[i] = contract.DigestItem{Body: it.Body, TaskID: it.TaskID, JobID: it.ID}
	}
	return items
}

// carrierStopped reports whether job's task stops it from being sent now:
// expired, cancelled, paused (or otherwise not sending), or its recipient
// suppressed for its category. Such a job leaves its digest and meets its
// outcome alone.
func (r *accountRunner) carrierStopped(job *contract.Job) bool {
	if !job.ExpiresAt.IsZero() && time.Now().After(job.ExpiresAt) {
		return true
	}
	if !controlLets(r.svc.controls.Get(job.TaskID), job) {
		return true
	}
	_, hit := r.svc.suppressed.Lookup(job.Channel, job.To, job.JobCategory())
	return hit
}

// handOverDigest hands the digest of a carrier that cannot send it to
// its next item, whose job is published as a scheduled carrier copy
// before the entry names it (with the items taken out so far, which that
// carrier publishes); with no item left, it publishes those and deletes
// the entry. The carrier then goes its own way (done false): out of
// digests when alone (its task stopped it), else free to merge again once
// the policy, which it meets next, lets it. With stay (a stopped carrier
// of a digest an attempt of which may have reached the recipient, which
// names the text the carrier's item is in), the carrier stays an item of
// the digest, whose outcome is its own, and its job is done (done true):
// sent alone, or given its own outcome and later resumed, its text could
// reach the recipient a second time under its own key.
func (r *accountRunner) handOverDigest(ctx context.Context, d *delivery, key string, e *digestEntry, rev uint64, alone, stay bool) (done, retry bool, err error) {
	s, job := r.svc, &d.job
	rest := slices.DeleteFunc(slices.Clone(e.Items), func(j contract.Job) bool { return j.ID == job.ID })
	if e.SendKey != "" {
		// Its text may have reached the recipient in the digest.
		job.MaybeSent = true
	}
	if len(rest) == 0 {
		if len(e.Out) > 0 {
			nrev, err := s.publishOut(ctx, key, e, rev)
			if isConflict(err) {
				return false, true, nil
			} else if err != nil {
				return true, false, shared.RetryAfter(time.Second, err)
			}
			rev = nrev
		}
		if err := s.ledger.Delete(ctx, key, jetstream.LastRevision(rev)); isConflict(err) {
			return false, true, nil
		} else if err != nil {
			return true, false, shared.RetryAfter(time.Second, err)
		}
		d.log.Debug("digest given up by its carrier, no item left")
	} else {
		next := rest[0]
		next.DigestCarrier, next.Recheck = true, true
		at := e.ClosesAt
		if soon := time.Now().Add(time.Second); at.Before(soon) {
			at = soon
		}
		at = at.Truncate(time.Second).Add(time.Second)
		if err := s.handOffItem(ctx, &next, e.Seqs[next.ID], contract.SubjectDelayPrefix+next.Account+"."+next.ID,
			fmt.Sprintf("%s:digest-carrier:%d", next.MsgID(), e.Seqs[next.ID]), at, contract.JobSubject(next.Account, next.Priority)); err != nil {
			return true, false, shared.RetryAfter(time.Second, fmt.Errorf("hand digest over: %w", err))
		}
		e.Carrier = next.ID
		if !stay {
			e.Items = rest
		}
		if _, err := s.updateDigest(ctx, key, e, rev); isConflict(err) {
			return false, true, nil
		} else if err != nil {
			return true, false, shared.RetryAfter(time.Second, fmt.Errorf("hand digest over: %w", err))
		}
		d.log.Debug("digest handed over", "carrier", next.ID, "stays_an_item", stay)
		if stay {
			return true, false, nil
		}
	}
	if r.svc.policy.For(job.Channel) != nil {
		// A reservation it made for the digest counts for no message now
		// (unless an earlier send may have reached the recipient:
		// releaseFrequency keeps it then); alone, it reserves again.
		r.releaseFrequency(ctx, d, nil)
	}
	// Like an item taken out.
	job.DigestCarrier, job.NoDigest = false, alone
	return false, false, nil
}

// handOverIfStopped hands the sealed digest d carries to its next item
// when d's own task stops it now (carrierStopped: expired, paused,
// cancelled, suppressed). carry checks that before it seals, but the
// carrier may be stopped afterwards, before its call (while it waits for
// its turn, or for a batch call): its own outcome then comes from
// mayStillSend or obeyControl, and the digest must not end with it, or
// the other items are never sent. The carrier goes on alone with its own
// text. A lost compare-and-set brings the job back to try again. Once an
// attempt of the digest may have reached the recipient (SendKey), the
// carrier stays an item of the digest instead and is done (done true,
// with err for the consume loop).
func (r *accountRunner) handOverIfStopped(ctx context.Context, d *delivery) (done bool, err error) {
	if d.digest == nil || !r.carrierStopped(&d.job) {
		return false, nil
	}
	return r.handOverSealed(ctx, d, true)
}

// handOverIfHeld hands the sealed digest d carries to its next item when
// d's job is about to be held on its account (reroute, capReached: no
// account of its pool to move to), which the items, of other tasks whose
// pools may have a healthy account, need not wait for. The carrier is
// held with its own text, free to merge again when it comes back. done
// and err as for handOverIfStopped.
func (r *accountRunner) handOverIfHeld(ctx context.Context, d *delivery) (done bool, err error) {
	if d.digest == nil {
		return false, nil
	}
	return r.handOverSealed(ctx, d, false)
}

// handOverSealed hands the sealed digest d carries to its next item
// (handOverDigest; alone as there); d sends its own text from then on.
func (r *accountRunner) handOverSealed(ctx context.Context, d *delivery, alone bool) (done bool, err error) {
	sd := d.digest
	if d.digestNamed {
		// Named by this delivery, whose call has not been made: no
		// attempt of the digest may have reached the recipient.
		sd.entry.SendKey, sd.entry.SendBody, d.digestNamed = "", "", false
	}
	done, retry, err := r.handOverDigest(ctx, d, sd.key, sd.entry, sd.rev, alone, sd.entry.SendKey != "")
	switch {
	case done:
		d.digest = nil
		return true, err
	case retry:
		return true, shared.RetryAfter(time.Second, errors.New("digest entry changed while handing it over"))
	}
	d.digest, d.sendKey, d.sendBody = nil, "", ""
	return false, nil
}

// forgetDigestAttempt has the entry forget the attempt d just made
// (SendKey) after an answer that says it did not reach the recipient, so
// the next carrier checks the items again and may take some out. Not
// recorded, the next carrier sends the digest again as it is.
func (r *accountRunner) forgetDigestAttempt(ctx context.Context, d *delivery) {
	sd := d.digest
	if sd == nil || sd.entry.SendKey == "" {
		return
	}
	e := sd.entry
	k, b := e.SendKey, e.SendBody
	e.SendKey, e.SendBody = "", ""
	rev, err := r.svc.updateDigest(ctx, sd.key, e, sd.rev)
	if err != nil {
		e.SendKey, e.SendBody = k, b
		d.log.Warn("could not forget a digest's attempt that did not reach the recipient; it is sent again as it is", "err", err)
		return
	}
	sd.rev = rev
}

// settleDigest records an accepted digest in its entry, then publishes
// every item's sent event and deletes the entry (finishDigest). Killed
// after the send and before the record, the carrier's redelivery sends
// again with the same Idempotency-Key, as any job's would.
func (r *accountRunner) settleDigest(ctx context.Context, d *delivery, ev *contract.Event) error {
	sd, s := d.digest, r.svc
	e := sd.entry
	e.State, e.Account, e.Attempt, e.ProviderID = digestSent, ev.Account, ev.Attempt, ev.ProviderID
	e.SentAt, e.LatencyMS, e.CallStartedAt = time.Now().UTC(), ev.LatencyMS, ev.CallStartedAt
	rev, err := s.updateDigest(ctx, sd.key, e, sd.rev)
	if err != nil {
		d.log.Error("could not record a sent digest; a redelivery may repeat it (same idempotency key)", "err", err)
		return fmt.Errorf("record sent digest: %w", err)
	}
	return s.finishDigest(ctx, sd.key, e, rev)
}

// finishDigest publishes the sent event of each of a sent digest's items
// (the carrier's last, as it stops the carrier's redelivery) and then
// deletes the entry.
func (s *Service) finishDigest(ctx context.Context, key string, e *digestEntry, rev uint64) error {
	var carrier *contract.Job
	for i := range e.Items {
		if e.Items[i].ID == e.Carrier {
			carrier = &e.Items[i]
			continue
		}
		if err := s.publishDigestSent(ctx, e, &e.Items[i]); err != nil {
			return err
		}
	}
	if carrier != nil {
		if err := s.publishDigestSent(ctx, e, carrier); err != nil {
			return err
		}
	}
	if err := s.ledger.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil && !isConflict(err) {
		return fmt.Errorf("delete sent digest: %w", err)
	}
	return nil
}

// publishDigestSent stores item's sent event, naming the carrier: the job
// whose id was the message's Idempotency-Key (SendKey; the carrier that
// sent it first, when a later one sent it again as it was). Unlike
// other sent events it has a Nats-Msg-Id: a digest finished again after a
// crash publishes its events again.
func (s *Service) publishDigestSent(ctx context.Context, e *digestEntry, item *contract.Job) error {
	by := e.Carrier
	if e.SendKey != "" {
		by = e.SendKey
	}
	ev := &contract.Event{TaskID: item.TaskID, JobID: item.ID, To: item.To, Account: e.Account, Kind: contract.EventSent,
		Attempt: max(e.Attempt, 1), Index: item.Index, Generation: item.Generation, ProviderID: e.ProviderID,
		CarriedBy: by, At: e.SentAt, CallStartedAt: e.CallStartedAt}
	if item.ID == e.Carrier {
		ev.Attempt, ev.LatencyMS = e.Attempt, e.LatencyMS
	}
	if item.ID == by {
		ev.DigestSize = len(e.Items)
	}
	data, err := contract.EncodeEvent(ev)
	if err != nil {
		return err
	}
	if _, err := s.js.Publish(ctx, contract.EventSubject(ev.TaskID, ev.Kind), data, jetstream.WithMsgID(item.MsgID()+":sent:digest")); err != nil {
		return fmt.Errorf("publish digest sent event: %w", err)
	}
	s.cfg.metrics.Outcome(ev)
	return nil
}

// handOffItem publishes job, an item of a digest, on subject with msgID
// (at and target, when set, schedule it), recorded first in its ledger
// entry as a handoff of the message at seq that joined the digest
// (handoff.go): that message, redelivered after a crash before its ack,
// then publishes the same copy again, which the stream drops, instead of
// joining another digest beside the copy.
func (s *Service) handOffItem(ctx context.Context, job *contract.Job, seq uint64, subject, msgID string, at time.Time, target string) error {
	h := handoff{Seq: seq, Subject: subject, MsgID: msgID, Account: job.Account, Attempts: job.Attempts, Moves: job.Moves,
		MaybeSent: job.MaybeSent, At: at, Target: target}
	if seq > 0 {
		le, err := s.readLedger(ctx, job)
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		le.Handoffs = append(le.Handoffs, h)
		if n := len(le.Handoffs); n > maxHandoffs {
			le.Handoffs = le.Handoffs[n-maxHandoffs:]
		}
		if err := s.writeLedger(ctx, job, le); err != nil {
			return fmt.Errorf("ledger: record the item's copy: %w", err)
		}
	}
	return s.publishCopy(ctx, &h, job)
}

// readDigest returns the digest at key and its revision; nil when none.
func (s *Service) readDigest(ctx context.Context, key string) (*digestEntry, uint64, error) {
	kv, err := s.ledger.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var e digestEntry
	if err := json.Unmarshal(kv.Value(), &e); err != nil {
		return nil, 0, fmt.Errorf("digest entry %s does not decode: %w", key, err)
	}
	return &e, kv.Revision(), nil
}

func (s *Service) createDigest(ctx context.Context, key string, e *digestEntry) (uint64, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return s.ledger.Create(ctx, key, data)
}

func (s *Service) updateDigest(ctx context.Context, key string, e *digestEntry, rev uint64) (uint64, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return s.ledger.Update(ctx, key, data, rev)
}

// isConflict reports whether err is a lost compare-and-set.
func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// backlogs caches each account's queued jobs (its normal lane's pending
// and unacknowledged count) for a second, for the backlog rule's jobs of
// the high and low lanes (a normal one's delivery carries the count).
type backlogs struct {
	mu sync.Mutex
	m  map[string]backlogLook
}

type backlogLook struct {
	n  int
	at time.Time
}

// get is account's backlog, ok false when it could not be read.
func (b *backlogs) get(ctx context.Context, js jetstream.JetStream, account string) (int, bool) {
	b.mu.Lock()
	l, ok := b.m[account]
	b.mu.Unlock()
	if ok && time.Since(l.at) < time.Second {
		return l.n, true
	}
	c, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, contract.PriorityNormal))
	if err != nil {
		return 0, false
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, false
	}
	l = backlogLook{n: int(info.NumPending) + info.NumAckPending, at: time.Now()}
	b.mu.Lock()
	if b.m == nil {
		b.m = map[string]backlogLook{}
	}
	b.m[account] = l
	b.mu.Unlock()
	return l.n, true
}

// releaseDigest, when the carrier gives up on its digest, takes the other
// items out (publishOut), so each gets its own attempts and outcome, and
// deletes the entry; the carrier's own job is given up as usual.
func (r *accountRunner) releaseDigest(ctx context.Context, d *delivery) error {
	sd, s := d.digest, r.svc
	if sd == nil {
		return nil
	}
	e := sd.entry
	if e.SendKey != "" {
		// An attempt may have reached the recipient: released, the items
		// would be sent again under their own keys. The next item carries
		// the digest as it is instead, with its own attempts.
		done, retry, err := r.handOverDigest(ctx, d, sd.key, e, sd.rev, true, false)
		switch {
		case done:
			return err
		case retry:
			return shared.RetryAfter(time.Second, errors.New("digest entry changed while handing it over"))
		}
		d.digest = nil
		return nil
	}
	for _, it := range e.Items {
		if it.ID != d.job.ID {
			it.NoDigest = true
			e.Out = append(e.Out, it)
		}
	}
	e.Items = slices.DeleteFunc(e.Items, func(j contract.Job) bool { return j.ID != d.job.ID })
	rev, err := s.updateDigest(ctx, sd.key, e, sd.rev)
	if err != nil {
		return shared.RetryAfter(time.Second, fmt.Errorf("release digest items: %w", err))
	}
	if rev, err = s.publishOut(ctx, sd.key, e, rev); err != nil {
		return shared.RetryAfter(time.Second, err)
	}
	if err := s.ledger.Delete(ctx, sd.key, jetstream.LastRevision(rev)); err != nil && !isConflict(err) {
		return shared.RetryAfter(time.Second, fmt.Errorf("delete released digest: %w", err))
	}
	d.digest = nil
	return nil
}

// publishOut publishes the items e.Out names as jobs of their own (sent
// alone when marked NoDigest), and then has the entry forget them; it
// returns the entry's new revision. Each copy is recorded as the handoff
// of the message that joined (handOffItem) and has a Nats-Msg-Id naming
// that message, so publishing again after a crash stores nothing new.
func (s *Service) publishOut(ctx context.Context, key string, e *digestEntry, rev uint64) (uint64, error) {
	for _, it := range e.Out {
		it.Recheck = true
		msgID := fmt.Sprintf("%s:digest-out:%d", it.MsgID(), e.Seqs[it.ID])
		if err := s.handOffItem(ctx, &it, e.Seqs[it.ID], contract.JobSubject(it.Account, it.Priority), msgID, time.Time{}, ""); err != nil {
			return 0, fmt.Errorf("take item out of digest: %w", err)
		}
	}
	e.Out = nil
	return s.updateDigest(ctx, key, e, rev)
}
