package contract

import "time"

// TaskRecord is kept in KV broadcast_tasks under the task id. Creating it is
// what makes a task id "seen": a later task with the same id is ignored, for
// as long as the bucket keeps it (well past the stream's duplicate window).
type TaskRecord struct {
	// Task is the validated task without its inline recipients (they travel
	// to render in batches), so the record stays small.
	Task Task `json:"task"`
	// Seq is the TASKS stream sequence of the accepted submission; a
	// redelivery of that same message carries on instead of being ignored.
	Seq uint64 `json:"seq"`
	// Total and Duplicates are known once expansion finished.
	Total      int `json:"total"`
	Duplicates int `json:"duplicates"`
	// Checkpoint is how many of the task's distinct recipients are already
	// in published render batches: a restarted expansion of a streamed list
	// resumes there instead of publishing them again.
	Checkpoint int `json:"checkpoint,omitempty"`
	// BatchSize is how many recipients go in each of the task's render
	// batches, fixed when the task is accepted so that a resumed or
	// released expansion cuts its batches as the first one did. 0 (records
	// written before it was kept): ingest's configured batch size.
	BatchSize int `json:"batch_size,omitempty"`
	// Released is set before a scheduled or approved task's recipients are
	// first published: a second release publishes them again (Resumed).
	Released bool `json:"released,omitempty"`
	// Expanded is set once every render batch was published.
	Expanded bool `json:"expanded"`
	// ListDigest pins recipients_object: the object's digest when the task
	// was accepted. A list replaced since is not sent (the task is
	// cancelled with the reason): its recipients are not the ones counted.
	ListDigest string    `json:"list_digest,omitempty"`
	AcceptedAt time.Time `json:"accepted_at"`
}

// RenderBatch carries consecutive recipients of a task from ingest to render.
type RenderBatch struct {
	TaskID string `json:"task_id"`
	// First is the index of Recipients[0] among the task's distinct recipients.
	First int `json:"first"`
	// Recipients hold normalised addresses; invalid ones are kept as given,
	// with Invalid set to the reason, so render can skip them with it.
	Recipients []BatchRecipient `json:"recipients"`
	// Test marks a batch of test recipients.
	Test bool `json:"test,omitempty"`
	// Resumed marks a batch published again after a crash or a redelivery:
	// some of its jobs may exist already, possibly sent (Job.Recheck).
	Resumed bool `json:"resumed,omitempty"`
}

// BatchRecipient is one recipient in a RenderBatch.
type BatchRecipient struct {
	To      string         `json:"to"`
	Vars    map[string]any `json:"vars,omitempty"`
	Invalid string         `json:"invalid,omitempty"`
}
