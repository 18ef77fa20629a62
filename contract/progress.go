package contract

import "time"

// TaskState is a task's place in its life.
type TaskState string

// Task states of the contract. The last five are final.
const (
	StatePending          TaskState = "pending"
	StateScheduled        TaskState = "scheduled"
	StateAwaitingApproval TaskState = "awaiting_approval"
	StateProcessing       TaskState = "processing"
	StatePaused           TaskState = "paused"
	StateSucceeded        TaskState = "succeeded"
	StatePartial          TaskState = "partial"
	StateFailed           TaskState = "failed"
	StateCancelled        TaskState = "cancelled"
	StateRejected         TaskState = "rejected"
)

// Final reports whether no further change is expected in this state.
func (s TaskState) Final() bool {
	switch s {
	case StateSucceeded, StatePartial, StateFailed, StateCancelled, StateRejected:
		return true
	}
	return false
}

// Progress is the value kept in KV broadcast_progress under the task id.
type Progress struct {
	TaskID      string     `json:"task_id"`
	State       TaskState  `json:"state"`
	Total       int        `json:"total"`
	Duplicates  int        `json:"duplicates"`
	Sent        int        `json:"sent"`
	Retrying    int        `json:"retrying"`
	Failed      int        `json:"failed"`
	Skipped     int        `json:"skipped"`
	Expired     int        `json:"expired"`
	Cancelled   int        `json:"cancelled"`
	SuccessRate float64    `json:"success_rate"`
	RatePerSec  float64    `json:"rate_per_sec"`
	ETASeconds  float64    `json:"eta_seconds"`
	Error       string     `json:"error"`
	CreatedAt   time.Time  `json:"created_at"`
	StartedAt   *time.Time `json:"started_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at"`

	// Channel and Priority describe the task for dashboards (extension).
	Channel  string   `json:"channel,omitempty"`
	Priority Priority `json:"priority,omitempty"`

	// Delivered, Read and Undelivered count sent recipients by what the
	// provider reported afterwards (services/feedback), folded per
	// recipient as the strongest evidence seen: undelivered < delivered <
	// read, so the counts do not depend on the order receipts arrive in.
	// Delivered counts read recipients too; each is at most Sent, and
	// Delivered+Undelivered <= Sent (extension).
	Delivered   int `json:"delivered,omitempty"`
	Read        int `json:"read,omitempty"`
	Undelivered int `json:"undelivered,omitempty"`
}

// Done is the number of recipients that reached a final outcome.
func (p *Progress) Done() int { return p.Sent + p.Failed + p.Skipped + p.Expired + p.Cancelled }
