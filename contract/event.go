package contract

import (
	"strconv"
	"time"
)

// EventKind names an outcome; it is the last token of the event subject.
type EventKind string

// Event kinds of the contract.
const (
	EventAccepted  EventKind = "accepted"
	EventRejected  EventKind = "rejected"
	EventSent      EventKind = "sent"
	EventRetrying  EventKind = "retrying"
	EventFailed    EventKind = "failed"
	EventSkipped   EventKind = "skipped"
	EventExpired   EventKind = "expired"
	EventCancelled EventKind = "cancelled"

	// Receipt kinds: what the provider reported later about a message it
	// accepted (a sent recipient). services/feedback publishes them.
	EventDelivered   EventKind = "delivered"
	EventRead        EventKind = "read"
	EventUndelivered EventKind = "undelivered"
)

// ReceiptKind reports whether k is a receipt kind (delivered, read,
// undelivered): it says what became of a sent message, not whether it was
// sent.
func (k EventKind) ReceiptKind() bool {
	return k == EventDelivered || k == EventRead || k == EventUndelivered
}

// CodeNoEnabledAccount is the code of the task-level retrying event (index
// -1) render publishes while a task's batches wait because none of its
// accounts is enabled; progress.error shows its error ("waiting: ...").
const CodeNoEnabledAccount = "no_enabled_account"

// Event is published on broadcast.events.<task>.<kind> for every outcome.
// The first nine fields are the contract; the rest are optional extensions.
type Event struct {
	TaskID  string    `json:"task_id"`
	JobID   string    `json:"job_id"`
	To      string    `json:"to"`
	Account string    `json:"account"`
	Kind    EventKind `json:"kind"`
	Attempt int       `json:"attempt"`
	Code    string    `json:"code"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`

	// Index is the recipient's position among the task's distinct recipients;
	// status uses it to count each recipient exactly once. -1 for task-level
	// events.
	Index int `json:"index"`
	// Class is the error class of a retrying or failed outcome.
	Class ErrorClass `json:"class,omitempty"`
	// Total and Duplicates are set on accepted events.
	Total      int `json:"total,omitempty"`
	Duplicates int `json:"duplicates,omitempty"`
	// State, on task-level events, is the state the task enters
	// (accepted: pending, scheduled, awaiting_approval or processing).
	State TaskState `json:"state,omitempty"`
	// RatePerSec is the account's effective send rate when the event was made.
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	// ProviderID is the provider's message id on sent events, when it gives one.
	ProviderID string `json:"provider_id,omitempty"`
	// Requeued marks the retrying event of a dead letter put back in the
	// queue by retry-dead: it moves the recipient from failed to retrying.
	Requeued bool `json:"requeued,omitempty"`
	// Generation is the job's generation (how many times retry-dead put
	// it back in the queue) on per-attempt outcomes of a re-queued job, so
	// that its attempts, numbered from 1 again, are not dropped by the
	// stream's duplicate window as repeats of the first generation's.
	Generation int `json:"generation,omitempty"`
	// LatencyMS is how long the provider call took.
	LatencyMS float64 `json:"latency_ms,omitempty"`
	// CallStartedAt, on an outcome of a provider call, is when the call
	// began: the moment the account's pacing counted it. A provider
	// counts the call when it arrives, which is later by the transport's
	// delay; the two tell pacing from transport (the scenario tester's
	// rate check uses both).
	CallStartedAt time.Time `json:"call_started_at,omitzero"`
	// CallShared marks a call-level failure (rate limited, retryable or
	// account fatal: a 429, a 5xx, a network error) that an earlier
	// recipient of the same batch provider call got with the same code; it
	// is on all such events of the call but one, so the circuit breaker and
	// the rate-limit metric count the call's answer once, as they count a
	// single send's. Permanent failures are never marked.
	CallShared bool `json:"call_shared,omitempty"`
	// MaybeSent, on an expired, cancelled, failed or retrying event, says
	// an earlier send of the job may have reached the recipient: its
	// answer was lost when a process died during the call (Job.MaybeSent).
	MaybeSent bool `json:"maybe_sent,omitempty"`
	// JobSeq and Delivery name the delivery of a job that told a
	// per-attempt outcome (retrying, expired, cancelled): its JOBS message's
	// stream sequence and delivery count. JobSeq is part of the
	// Nats-Msg-Id, as attempt numbers repeat across copies of a job (a move
	// or a held job spends none) and each such outcome is true; within one
	// message the attempt tells deliveries apart, and a redelivery after a
	// crash telling the same outcome again is stored once.
	JobSeq   uint64 `json:"job_seq,omitempty"`
	Delivery uint64 `json:"delivery,omitempty"`
	// CarriedBy, on a sent event, names the job whose provider message
	// carried this one as part of a digest (its own id for the carrier);
	// DigestSize, on the carrier's, how many items that message merged.
	CarriedBy  string `json:"carried_by,omitempty"`
	DigestSize int    `json:"digest_size,omitempty"`
}

// MsgID is the Nats-Msg-Id of the event, so a republished outcome within the
// stream's duplicate window is stored once. Status counts exactly regardless.
// Sent events go without one (see publishOpts). An event saying maybe_sent
// has an id of its own: it must never be dropped as a repeat of the same
// outcome told without it (by another copy of the job). An outcome of a
// delivery names its message (JobSeq), so the same outcome of another copy
// of the job is not a duplicate.
func (e *Event) MsgID() string {
	if e.JobID == "" {
		return e.TaskID + ":" + string(e.Kind)
	}
	if e.Requeued {
		return e.JobID + ":requeued:" + e.At.Format("20060102T150405.000000000")
	}
	id := e.JobID + ":" + string(e.Kind) + ":" + itoa(e.Attempt)
	if e.Generation > 0 {
		id += ":g" + itoa(e.Generation)
	}
	if e.MaybeSent {
		id += ":maybe"
	}
	if e.JobSeq > 0 {
		id += ":s" + strconv.FormatUint(e.JobSeq, 10)
	}
	return id
}
