package contract

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Job is one send: a rendered message for one recipient (or, for batch
// channels, one of the recipients of a merged call), published by render on
// broadcast.jobs.<account>.<priority> and consumed by dispatch.
type Job struct {
	// ID is stable for a task and recipient across attempts and crashes; it
	// is the Idempotency-Key sent to providers.
	ID          string    `json:"id"`
	TaskID      string    `json:"task_id"`
	Index       int       `json:"index"`
	To          string    `json:"to"`
	Body        string    `json:"body"`
	Channel     string    `json:"channel"`
	Account     string    `json:"account"`
	Priority    Priority  `json:"priority"`
	MaxAttempts int       `json:"max_attempts"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
	EnqueuedAt  time.Time `json:"enqueued_at"`
	// Vars are the recipient's own variables (the task's defaults are not
	// merged in), kept for channels whose provider fills its own templates
	// (WhatsApp template messages) and for the recipient's zone.
	Vars map[string]any `json:"vars,omitempty"`
	// TaskTZ is the task's defaults variable tz, when it is a string: the
	// zone of quiet hours for a recipient without a usable tz of its own,
	// ahead of its phone number's region (internal/policy.Zone). It is
	// carried alone rather than merged into Vars, which would copy every
	// default into every job.
	TaskTZ string `json:"task_tz,omitempty"`
	// Pool is the accounts the task may use; empty means every enabled
	// account of the channel (unless PoolInTask). A job moves only within
	// its pool.
	Pool []string `json:"pool,omitempty"`
	// PoolInTask says the pool is the task's accounts list, longer than
	// MaxJobPool: it is read from the task's record in KV broadcast_tasks
	// when the job has to move, instead of being copied into every job (a
	// pool of 1,000 accounts made each job 30 KB).
	PoolInTask bool `json:"pool_in_task,omitempty"`
	// Test marks a test recipient, sent before the task is approved.
	Test bool `json:"test,omitempty"`
	// Attempts is how many attempts were made before this message was
	// published (a job re-published to wait out a long delay carries its
	// count along). The current attempt is Attempts + the delivery count.
	Attempts int `json:"attempts,omitempty"`
	// Recheck marks a job that may have been sent before under another
	// message (re-published after a wait or a move, re-queued, or rendered
	// again by a resumed expansion): dispatch consults the ledger even on
	// its first delivery. Render's fresh jobs skip that lookup.
	Recheck bool `json:"recheck,omitempty"`
	// Generation increases each time dead letters are retried, so the
	// re-queued job is not dropped as a duplicate publish.
	Generation int `json:"generation,omitempty"`
	// Moves counts the job's moves between accounts (reroute); they spend
	// no attempt. A move's Nats-Msg-Id names the moved message's stream
	// sequence, so a job bounced A to B to A again within the duplicate
	// window is stored at every move.
	Moves int `json:"moves,omitempty"`
	// MaybeSent marks a job one of whose sends may have reached the
	// provider with its answer lost: a delivery that left no outcome (the
	// process died or the ack wait ran out during the call), or one queued
	// before a server restart lost its delivery count. Its events other
	// than sent say so (Event.MaybeSent).
	MaybeSent bool `json:"maybe_sent,omitempty"`
	// Category is the task's category; empty (jobs rendered before it
	// existed) reads as marketing (JobCategory).
	Category Category `json:"category,omitempty"`
	// DigestKey, DigestWindow and DigestTemplate are the task's digest
	// fields (Task.DigestKey). DigestCarrier marks the copy of a job that
	// carries a digest, scheduled for the end of its window; NoDigest a job
	// taken out of a digest (its task could not send then), sent alone.
	DigestKey      string   `json:"digest_key,omitempty"`
	DigestWindow   Duration `json:"digest_window,omitempty"`
	DigestTemplate string   `json:"digest_template,omitempty"`
	DigestCarrier  bool     `json:"digest_carrier,omitempty"`
	NoDigest       bool     `json:"no_digest,omitempty"`
}

// JobCategory is the job's category, marketing when unset.
func (j *Job) JobCategory() Category {
	if j.Category == "" {
		return CategoryMarketing
	}
	return j.Category
}

// MaxJobPool is the longest accounts list a job carries itself (Job.Pool);
// a task naming more has its jobs refer to it (Job.PoolInTask).
const MaxJobPool = 16

// SetPool gives the job the pool of a task naming accounts.
func (j *Job) SetPool(accounts []string) {
	if len(accounts) > MaxJobPool {
		j.Pool, j.PoolInTask = nil, true
		return
	}
	j.Pool, j.PoolInTask = accounts, false
}

// JobID is the job id of the recipient at index in task. Test recipients use
// a "t" prefix so they never collide with the task's own recipients.
func JobID(taskID string, index int, test bool) string {
	if test {
		return taskID + ".t" + strconv.Itoa(index)
	}
	return taskID + "." + strconv.Itoa(index)
}

// ParseJobID splits a job id into task id, index and test flag.
func ParseJobID(id string) (taskID string, index int, test bool, err error) {
	taskID, rest, ok := strings.Cut(id, ".")
	if !ok {
		return "", 0, false, fmt.Errorf("job id %q has no index", id)
	}
	if r, ok := strings.CutPrefix(rest, "t"); ok {
		test, rest = true, r
	}
	index, err = strconv.Atoi(rest)
	if err != nil || index < 0 {
		return "", 0, false, fmt.Errorf("job id %q has a bad index", id)
	}
	return taskID, index, test, nil
}

// MsgID is the Nats-Msg-Id the job is published with, so re-running a render
// batch within the duplicate window never enqueues twice.
func (j *Job) MsgID() string {
	if j.Generation == 0 {
		return j.ID
	}
	return j.ID + ":g" + strconv.Itoa(j.Generation)
}

// LedgerKey is the key of the job's entry in the idempotency ledger.
func (j *Job) LedgerKey() string { return LedgerKey(j.TaskID, j.ID) }

// LedgerKey is the ledger key for jobID of taskID. It groups a task's entries
// under one prefix so they can be listed and purged together.
func LedgerKey(taskID, jobID string) string {
	return taskID + "." + strings.TrimPrefix(jobID, taskID+".")
}
