package contract

import "time"

// Control actions accepted on broadcast.control.<task>.
const (
	ActionPause     = "pause"
	ActionResume    = "resume"
	ActionCancel    = "cancel"
	ActionRetryDead = "retry-dead"
)

// ControlRequest is the body of a control request.
type ControlRequest struct {
	Action string `json:"action"`
	// Reason is recorded with a pause (the circuit breaker gives one).
	Reason string `json:"reason,omitempty"`
	// Seqs, with retry-dead, re-queues only these dead letters (their
	// sequences in stream DEAD, as GET /api/tasks/{id}/dead lists them);
	// empty re-queues them all. At most MaxRetrySelection.
	Seqs []uint64 `json:"seqs,omitempty"`
}

// MaxRetrySelection bounds the dead letters one retry-dead of a selection
// names.
const MaxRetrySelection = 1000

// ControlReply answers a control request.
type ControlReply struct {
	OK    bool      `json:"ok"`
	State TaskState `json:"state,omitempty"`
	Error string    `json:"error,omitempty"`
	// Requeued is how many dead letters retry-dead put back in the queue.
	Requeued int `json:"requeued,omitempty"`
}

// Control is a task's run state, kept in KV broadcast_control under the task
// id by ingest. Dispatch parks the jobs of a task that is not running and
// cancels those of a cancelled one; status shows the state in progress.
type Control struct {
	State  TaskState `json:"state"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// Sends reports whether the task's (non-test) jobs may be sent now.
func (c Control) Sends() bool { return c.State == "" || c.State == StateProcessing }

// ParkedSubject holds the jobs of a task that is paused, scheduled or
// awaiting approval, until it runs again.
func ParkedSubject(taskID, account string) string {
	return SubjectParkedPrefix + taskID + "." + account
}

// ParkedFilter matches every parked job of a task.
func ParkedFilter(taskID string) string { return SubjectParkedPrefix + taskID + ".>" }
