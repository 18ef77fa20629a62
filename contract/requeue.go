package contract

// Re-queueing parked jobs and dead letters is dispatch's work: only the
// services that enqueue sends (render, dispatch) may publish jobs, so that
// nats.conf can deny ingest broadcast.jobs.> (least privilege). Ingest, which
// answers control requests, asks dispatch with a request on
// broadcast.requeue.<task>; the request names a task and an action, never a
// job, so a compromised ingest still cannot enqueue a message of its own.
// These subjects are internal: not part of the contract.

// SubjectRequeuePrefix is where ingest asks dispatch to re-queue a task's
// parked jobs or dead letters (core request/reply, queue group "dispatch").
const SubjectRequeuePrefix = "broadcast.requeue."

// RequeueSubject is the request subject for task.
func RequeueSubject(taskID string) string { return SubjectRequeuePrefix + taskID }

// Re-queue actions.
const (
	// RequeueParked puts the task's parked jobs back in their queues (after
	// a resume or cancel); dispatch answers at once and works in the
	// background.
	RequeueParked = "unpark"
	// RequeueDead re-queues the task's dead letters (retry-dead) and answers
	// with how many.
	RequeueDead = "retry-dead"
)

// RequeueRequest is the body of a request on broadcast.requeue.<task>.
type RequeueRequest struct {
	Action string `json:"action"`
	// Seqs, with retry-dead, names the dead letters to re-queue (their
	// sequences in DEAD; each must be the task's); empty means all.
	Seqs []uint64 `json:"seqs,omitempty"`
}

// RequeueReply answers it.
type RequeueReply struct {
	OK       bool   `json:"ok"`
	Requeued int    `json:"requeued,omitempty"`
	Error    string `json:"error,omitempty"`
}
