package contract

import "time"

// The recipient index answers "did this customer get our message?"
// without reading the events of every task: status, while it folds,
// publishes one LookupEntry per recipient outcome (sent, failed, skipped,
// expired, cancelled, and the receipts) on broadcast.lookup.<hash>, where
// hash is RecipientHash of the recipient in the form suppression scope
// "all" uses (internal/suppress.Normalize). Stream LOOKUP keeps the last
// LookupKeptPerRecipient entries of each recipient for the events'
// retention. It holds recipients: personal data (docs/security.md).

// SubjectLookupPrefix starts the index's subjects.
const SubjectLookupPrefix = "broadcast.lookup."

// LookupKeptPerRecipient is how many entries LOOKUP keeps per recipient.
const LookupKeptPerRecipient = 200

// LookupSubject is the index subject of a recipient's hash.
func LookupSubject(hash string) string { return SubjectLookupPrefix + hash }

// LookupEntry is one outcome of one recipient in one task.
type LookupEntry struct {
	TaskID  string    `json:"task_id"`
	JobID   string    `json:"job_id"`
	To      string    `json:"to"`
	Account string    `json:"account"`
	Kind    EventKind `json:"kind"`
	Attempt int       `json:"attempt,omitempty"`
	Code    string    `json:"code,omitempty"`
	Error   string    `json:"error,omitempty"`
	At      time.Time `json:"at"`
}
