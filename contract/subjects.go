package contract

import "strings"

// Stream names.
const (
	StreamTasks  = "TASKS"
	StreamRender = "RENDER"
	StreamJobs   = "JOBS"
	StreamEvents = "EVENTS"
	StreamDead   = "DEAD"
	// StreamReceipts keeps every receipt services/feedback accepted from a
	// provider, stored before the provider's request is answered.
	StreamReceipts = "RECEIPTS"
	// StreamLookup indexes outcomes by recipient for GET /api/lookup
	// (contract/lookup.go).
	StreamLookup = "LOOKUP"
)

// KV bucket and object store names.
const (
	BucketProgress   = "broadcast_progress"
	BucketAccounts   = "broadcast_accounts"
	BucketTasks      = "broadcast_tasks"
	BucketLedger     = "broadcast_ledger"
	BucketRecipients = "broadcast_recipients"
	BucketStatus     = "broadcast_status"
	BucketHealth     = "broadcast_health"
	BucketControl    = "broadcast_control"
	BucketSends      = "broadcast_sends"
	BucketLeases     = "broadcast_leases"
	// BucketLanes holds the mark a dispatch session leaves as its account
	// goes to sleep (internal): the account's lanes held no job through
	// the JOBS sequence the mark names, so the jobs queued after it were
	// never delivered, whether the session kept its normal lane's consumer
	// (within DISPATCH_KEPT_CONSUMERS) or deleted it.
	BucketLanes = "broadcast_lanes"
	// BucketGroupings holds how render laid each batch's jobs out in
	// messages (internal, Grouping), written before it publishes them, so
	// a batch rendered again is grouped the same way.
	BucketGroupings = "broadcast_groupings"
	// BucketProviderIDs maps the provider message ids of sent events (and
	// email recipients of SMTP sends) to their task and recipient, for
	// services/feedback (internal).
	BucketProviderIDs = "broadcast_provider_ids"
)

// Subjects. Those in the contract (tasks, control, events, dead) must never be
// renamed; render and jobs subjects are internal but stable.
const (
	SubjectTasks         = "broadcast.tasks"
	SubjectControlPrefix = "broadcast.control."
	SubjectEventsPrefix  = "broadcast.events."
	SubjectDeadPrefix    = "broadcast.dead."
	SubjectRenderPrefix  = "broadcast.render."
	SubjectJobsPrefix    = "broadcast.jobs."
	SubjectDelayPrefix   = "broadcast.delay."
	SubjectParkedPrefix  = "broadcast.parked."
	SubjectStartPrefix   = "broadcast.start."
	// SubjectReceiptsPrefix begins broadcast.receipts.<source>.<account>,
	// where services/feedback stores provider receipts (internal).
	SubjectReceiptsPrefix = "broadcast.receipts."
)

// maxIDLen is the longest task id or account name.
const maxIDLen = 64

// ValidID reports whether s is usable as a task id or account name: it must be
// a valid KV key and a single subject token, 1-64 of A-Z, a-z, 0-9, '_'
// and '-'. Status checks the task id of every event it folds, so this is a
// loop rather than a regular expression (under a tenth of its cost).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// EventSubject is where an event of kind for task is published.
func EventSubject(taskID string, kind EventKind) string {
	return SubjectEventsPrefix + taskID + "." + string(kind)
}

// DeadSubject is where a given-up job of task is kept.
func DeadSubject(taskID string) string { return SubjectDeadPrefix + taskID }

// ControlSubject is the request/reply subject controlling task.
func ControlSubject(taskID string) string { return SubjectControlPrefix + taskID }

// RenderSubject carries recipient batches of task from ingest to render.
func RenderSubject(taskID string) string { return SubjectRenderPrefix + taskID }

// HeldSubject is where dispatch holds a job of account that waits for
// capacity (a reached daily cap, no healthy account to move to), as a
// scheduled message like any delay; an account edit that adds capacity
// wakes the held jobs early. Job ids are <task>.<index>, so a held job's
// subject has one token more than a delayed one's, and HeldFilter, which
// counts tokens, never matches the delay of a task named "held".
func HeldSubject(account, jobID string) string {
	return SubjectDelayPrefix + account + ".held." + jobID
}

// HeldFilter matches every held job of account.
func HeldFilter(account string) string { return SubjectDelayPrefix + account + ".held.*.*" }

// ReceiptSubject is where feedback stores a receipt of source (whatsapp,
// webhook, bounce) for account ("_" when the receipt names none).
func ReceiptSubject(source, account string) string {
	if account == "" {
		account = "_"
	}
	return SubjectReceiptsPrefix + source + "." + account
}

// JobSubject carries jobs for account at priority from render to dispatch.
func JobSubject(account string, p Priority) string {
	return SubjectJobsPrefix + account + "." + string(p)
}

// JobsFilter matches every job of account, whatever its priority.
func JobsFilter(account string) string { return SubjectJobsPrefix + account + ".>" }

// TaskFromSubject returns the task token of an events, dead, render or control
// subject, or "" when the subject has none.
func TaskFromSubject(subject string) string {
	for _, p := range []string{SubjectEventsPrefix, SubjectDeadPrefix, SubjectRenderPrefix, SubjectControlPrefix} {
		if rest, ok := strings.CutPrefix(subject, p); ok {
			task, _, _ := strings.Cut(rest, ".")
			return task
		}
	}
	return ""
}
