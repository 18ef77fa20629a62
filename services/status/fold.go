package status

import (
	"slices"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// outcome is one recipient's state in the fold.
type outcome byte

const (
	outNone outcome = iota
	outRetrying
	outSent
	outFailed
	outSkipped
	outExpired
	outCancelled
	// outWaiting is a retrying recipient held for a reason of the account or
	// its pool (a reached daily cap, no healthy account) rather than for a
	// backoff: it counts as retrying, and while any recipient waits the
	// latest reason shows in progress.error.
	outWaiting
)

// receipt is one recipient's strongest receipt so far: the fold keeps the
// maximum, so the counts do not depend on the order receipts arrive in
// (WhatsApp does not keep it: delivered may come after failed). Positive
// evidence of arrival wins: a recipient reported undelivered and later
// delivered (another device, a provider's retry) counts as delivered, and
// one reported read was delivered.
type receipt byte

const (
	rcptNone receipt = iota
	rcptUndelivered
	rcptDelivered
	rcptRead
)

func receiptOf(k contract.EventKind) receipt {
	switch k {
	case contract.EventUndelivered:
		return rcptUndelivered
	case contract.EventDelivered:
		return rcptDelivered
	case contract.EventRead:
		return rcptRead
	}
	return rcptNone
}

// waitingPrefix starts progress.error while recipients wait.
const waitingPrefix = "waiting: "

// waitCode reports whether a retrying code puts a recipient in outWaiting:
// a wait for capacity, for an account's quality, or for the recipient's
// quiet hours to end, none of them a failure (the circuit breaker does not
// count them either).
func waitCode(code string) bool {
	return code == "daily_cap" || code == "no_healthy_account" || code == contract.CodeNoEnabledAccount ||
		code == contract.CodeQualityRed || code == contract.CodeQuietHours
}

func outcomeOf(k contract.EventKind) (outcome, bool) {
	switch k {
	case contract.EventRetrying:
		return outRetrying, true
	case contract.EventSent:
		return outSent, true
	case contract.EventFailed:
		return outFailed, true
	case contract.EventSkipped:
		return outSkipped, true
	case contract.EventExpired:
		return outExpired, true
	case contract.EventCancelled:
		return outCancelled, true
	}
	return outNone, false
}

// maxRecipientIndex bounds the outcomes of a task whose total is not known
// yet (256 MB, far beyond any list).
const maxRecipientIndex = 1 << 28

// taskFold is the fold state of one task.
type taskFold struct {
	P        contract.Progress `json:"progress"`
	Outcomes []byte            `json:"outcomes"`
	// Receipts holds each recipient's receipt (receipt), indexed like
	// Outcomes; nil until the first receipt. A checkpoint written before
	// receipts existed has none and loads as nil.
	Receipts []byte `json:"receipts,omitempty"`
	// Tests holds test recipients' outcomes; they are not part of total.
	Tests    map[int]outcome `json:"tests,omitempty"`
	Accepted bool            `json:"accepted"`
	Rate     rateMeter       `json:"rate"`

	// Waiting counts recipients in outWaiting; WaitReason is the latest
	// reason one of them got. It shows in progress.error while Waiting > 0.
	Waiting    int    `json:"waiting,omitempty"`
	WaitReason string `json:"wait_reason,omitempty"`
	// TaskWait is why the task's batches are held before any recipient has
	// a job (render's task-level retrying event, code no_enabled_account);
	// it shows in progress.error until a recipient's event arrives.
	TaskWait string `json:"task_wait,omitempty"`
	// LastOutcomeAt is the latest time among the outcomes folded, the
	// task's finished_at once every recipient has one: events are folded
	// in the order they were stored, and a sent event published again (a
	// job redelivered after its send) keeps the time of its send.
	LastOutcomeAt time.Time `json:"last_outcome_at,omitzero"`

	dirty bool
	// unsaved says events changed the fold since its last checkpoint; a
	// rewrite of progress alone (rate, ETA, run state) needs none, so an
	// idle paused task is not checkpointed every second.
	unsaved   bool
	lastWrite time.Time
	// rev is the progress entry's revision as this replica last wrote or
	// read it, 0 when unknown (writeProgress).
	rev uint64
	// lastReceipt is when a receipt last changed the fold: a finished task
	// receiving receipts stays in memory (keepReceiving) instead of
	// loading and saving its checkpoint for every flush's worth of them.
	lastReceipt time.Time
	breaker     breakerWindow
}

func newFold(taskID string) *taskFold {
	return &taskFold{P: contract.Progress{TaskID: taskID, State: contract.StatePending}, Tests: map[int]outcome{}}
}

// apply folds one event in and reports whether progress changed.
func (f *taskFold) apply(ev *contract.Event) bool {
	switch ev.Kind {
	case contract.EventAccepted:
		return f.accept(ev)
	case contract.EventRejected:
		if f.Accepted {
			return false
		}
		f.P.State, f.P.Error = contract.StateRejected, ev.Error
		f.P.CreatedAt, f.P.UpdatedAt = ev.At, ev.At
		at := ev.At
		f.P.FinishedAt = &at
		return true
	}
	if ev.Kind.ReceiptKind() {
		return f.applyReceipt(ev)
	}
	to, ok := outcomeOf(ev.Kind)
	if ok && ev.Index < 0 && to == outRetrying && waitCode(ev.Code) {
		// The whole task waits (no enabled account): nothing is counted.
		changed := f.TaskWait != ev.Error
		f.TaskWait = ev.Error
		return changed
	}
	if !ok || ev.Index < 0 {
		return false
	}
	// A recipient's outcome means a batch got past what held the task.
	f.TaskWait = ""
	if _, _, test, err := contract.ParseJobID(ev.JobID); err == nil && test {
		from := f.Tests[ev.Index]
		if allowed(from, to) {
			f.Tests[ev.Index] = to
			return true
		}
		return false
	}
	if ev.Index >= len(f.Outcomes) {
		if f.Accepted || ev.Index >= maxRecipientIndex {
			// An index beyond total is not this task's; one beyond any
			// list's size is a stray event, not worth gigabytes.
			return false
		}
		// Grow geometrically: a streamed task's events arrive before its
		// total is known, in rising index order.
		f.Outcomes = slices.Grow(f.Outcomes, ev.Index+1-len(f.Outcomes))[:ev.Index+1]
	}
	// The breaker sees every attempt, repeated retries of one job included:
	// a provider failing everything keeps the same few jobs cycling.
	f.breaker.record(ev)
	from := outcome(f.Outcomes[ev.Index])
	if to == outRetrying && waitCode(ev.Code) {
		to = outWaiting
	}
	if to == outWaiting && from == outWaiting {
		// Still waiting: only the reason may have changed.
		changed := f.WaitReason != ev.Error
		f.WaitReason = ev.Error
		return changed
	}
	requeue := ev.Requeued && from == outFailed && to == outRetrying
	if !allowed(from, to) && !requeue {
		return false
	}
	if to == outWaiting {
		f.WaitReason = ev.Error
	}
	if requeue && f.P.State.Final() {
		// retry-dead reopens a finished task.
		f.P.State, f.P.FinishedAt = contract.StateProcessing, nil
	}
	f.Outcomes[ev.Index] = byte(to)
	f.count(from, -1)
	f.count(to, +1)
	if to == outSent {
		// A receipt folded before its sent event counts from now on.
		f.countReceipt(f.receiptAt(ev.Index), +1)
	}
	if f.P.StartedAt == nil || ev.At.Before(*f.P.StartedAt) {
		at := ev.At
		f.P.StartedAt = &at
	}
	if ev.At.After(f.LastOutcomeAt) {
		f.LastOutcomeAt = ev.At
	}
	if to == outSent {
		f.Rate.add(1)
	}
	f.finishIfDone(ev.At)
	return true
}

// allowed says which transitions an event may make. Final outcomes stick,
// so a late or repeated event never changes a count; a failed recipient
// can still become sent (dead letters retried).
func allowed(from, to outcome) bool {
	switch from {
	case outNone:
		return true
	case outRetrying:
		return to != outRetrying
	case outWaiting:
		return to != outWaiting
	case outFailed:
		return to == outSent
	}
	return false
}

func (f *taskFold) count(o outcome, d int) {
	switch o {
	case outRetrying:
		f.P.Retrying += d
	case outWaiting:
		f.P.Retrying += d
		f.Waiting += d
	case outSent:
		f.P.Sent += d
	case outFailed:
		f.P.Failed += d
	case outSkipped:
		f.P.Skipped += d
	case outExpired:
		f.P.Expired += d
	case outCancelled:
		f.P.Cancelled += d
	}
}

// applyReceipt folds a delivered, read or undelivered event: the
// recipient's receipt becomes the maximum of what it was and what the event
// says. Only sent recipients are counted, so no count exceeds sent and
// delivered+undelivered never does either; a receipt ahead of its sent
// event is kept and counts once the recipient is sent. It applies to
// finished tasks too: receipts come after the sends.
func (f *taskFold) applyReceipt(ev *contract.Event) bool {
	to := receiptOf(ev.Kind)
	// feedback publishes a receipt only after reading its sent event from
	// the same stream, so the recipient has its slot by now; an index
	// beyond the outcomes is a stray event, not worth memory.
	if ev.Index < 0 || ev.Index >= len(f.Outcomes) {
		return false
	}
	if _, _, test, err := contract.ParseJobID(ev.JobID); err == nil && test {
		return false // test recipients are not part of total
	}
	from := f.receiptAt(ev.Index)
	if to <= from {
		return false
	}
	if ev.Index >= len(f.Receipts) {
		f.Receipts = append(f.Receipts, make([]byte, len(f.Outcomes)-len(f.Receipts))...)
	}
	f.Receipts[ev.Index] = byte(to)
	if outcome(f.Outcomes[ev.Index]) == outSent {
		f.countReceipt(from, -1)
		f.countReceipt(to, +1)
	}
	// Changed even when no count did: the state must be checkpointed
	// before the event is acknowledged.
	return true
}

// receiptAt is recipient i's receipt.
func (f *taskFold) receiptAt(i int) receipt {
	if i < len(f.Receipts) {
		return receipt(f.Receipts[i])
	}
	return rcptNone
}

// countReceipt adds d to the counts receipt r is part of: delivered
// counts read recipients too.
func (f *taskFold) countReceipt(r receipt, d int) {
	switch r {
	case rcptUndelivered:
		f.P.Undelivered += d
	case rcptDelivered:
		f.P.Delivered += d
	case rcptRead:
		f.P.Delivered += d
		f.P.Read += d
	}
}

func (f *taskFold) accept(ev *contract.Event) bool {
	if f.Accepted {
		return false
	}
	if f.P.State == contract.StateRejected {
		// The id was rejected before and is now accepted with a fixed task.
		*f = *newFold(f.P.TaskID)
	}
	f.Accepted = true
	f.P.Total, f.P.Duplicates = ev.Total, ev.Duplicates
	f.P.CreatedAt = ev.At
	f.P.Error = ""
	f.P.State = contract.StateProcessing
	if ev.State != "" {
		f.P.State = ev.State
	}
	if len(f.Outcomes) < ev.Total {
		grown := make([]byte, ev.Total)
		copy(grown, f.Outcomes)
		f.Outcomes = grown
	}
	f.finishIfDone(ev.At)
	return true
}

// finishIfDone sets the final state once every recipient has an outcome,
// finished at the latest of at and the outcomes' times.
func (f *taskFold) finishIfDone(at time.Time) {
	p := &f.P
	if !f.Accepted || p.State.Final() || p.Done() < p.Total {
		return
	}
	if f.Waiting == 0 && strings.HasPrefix(p.Error, waitingPrefix) {
		p.Error = "" // nobody waits any more
	}
	switch {
	case p.Cancelled > 0:
		p.State = contract.StateCancelled
	case p.Sent == p.Total:
		p.State = contract.StateSucceeded
	case p.Sent > 0:
		p.State = contract.StatePartial
	default:
		p.State = contract.StateFailed
	}
	if f.LastOutcomeAt.After(at) {
		at = f.LastOutcomeAt
	}
	p.FinishedAt = &at
}

// refresh recomputes the derived fields before a write. ctl is the task's
// run state from KV broadcast_control.
func (f *taskFold) refresh(now time.Time, ctl contract.Control) {
	p := &f.P
	if f.Accepted && !p.State.Final() {
		switch ctl.State {
		case contract.StatePaused, contract.StateAwaitingApproval, contract.StateScheduled:
			p.State = ctl.State
		default:
			p.State = contract.StateProcessing
		}
		switch {
		case ctl.State == contract.StatePaused && ctl.Reason != "":
			p.Error = "paused: " + ctl.Reason
		case f.Waiting > 0 && f.WaitReason != "":
			p.Error = waitingPrefix + f.WaitReason
		case f.TaskWait != "":
			p.Error = waitingPrefix + f.TaskWait
		default:
			p.Error = ""
		}
	}
	if p.State == contract.StateCancelled && ctl.State == contract.StateCancelled && ctl.Reason != "" && p.Error == "" {
		p.Error = "cancelled: " + ctl.Reason
	}
	if done := p.Done(); done > 0 {
		p.SuccessRate = round4(float64(p.Sent) / float64(done))
	}
	p.RatePerSec = round4(f.Rate.perSecond(now))
	p.ETASeconds = 0
	if !p.State.Final() && p.RatePerSec > 0 {
		p.ETASeconds = float64(int(float64(p.Total-p.Done())/p.RatePerSec + 0.5))
	}
	if p.State.Final() {
		p.RatePerSec = round4(f.Rate.average())
	}
	p.UpdatedAt = now
}

func round4(v float64) float64 { return float64(int64(v*10000+0.5)) / 10000 }
