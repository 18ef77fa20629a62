package feedback

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// Receipt sources: the route a receipt came in by, the second token of
// its subject in RECEIPTS.
const (
	SourceWhatsApp = "whatsapp"
	SourceWebhook  = "webhook"
	SourceBounce   = "bounce"
	// SourceWxPusher is the WxPusher poller's final statuses.
	SourceWxPusher = "wxpusher"
)

// Receipt statuses, normalised across providers. WhatsApp and the webhook
// channel report sent, delivered, read and failed; bounces are hard, soft
// or complaint.
const (
	StatusSent      = "sent"
	StatusDelivered = "delivered"
	StatusRead      = "read"
	StatusFailed    = "failed"
	BounceHard      = "hard"
	BounceSoft      = "soft"
	BounceComplaint = "complaint"
)

// Receipt is what feedback stores in RECEIPTS for each status a provider
// reported, before it answers the provider. It holds no secret.
type Receipt struct {
	Source  string `json:"source"`
	Account string `json:"account,omitempty"`
	// ID is the provider's message id (WhatsApp: the wamid; webhook
	// channel: the Idempotency-Key, which is the job id; WxPusher: the
	// sendRecordId).
	ID string `json:"id,omitempty"`
	// Email is the bounced recipient (bounces only), lower-cased.
	Email string `json:"email,omitempty"`
	// To is the recipient a WhatsApp status names (recipient_id, with a
	// leading "+"), kept for the suppression list (suppress.go).
	To     string `json:"to,omitempty"`
	Status string `json:"status"`
	// Code and Error are the provider's reason for a failure.
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// At is when the provider says the status happened; Received is when
	// feedback accepted it.
	At       time.Time `json:"at"`
	Received time.Time `json:"received"`
}

// msgID is the receipt's Nats-Msg-Id: a provider retrying a post stores
// it once within the stream's duplicate window (beyond it, the events'
// ids and status's fold keep the counts exact).
func (r *Receipt) msgID() string {
	return hashHex(r.Source, r.Account, r.ID, r.Email, r.Status, r.Code)[:40]
}

// maxErrorBytes bounds the provider's reason kept on a receipt.
const maxErrorBytes = 500

// clip shortens s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// hashHex is the hex SHA-256 of parts joined by NUL bytes (no part
// contains one that could make two lists hash alike: they are ids and
// names from JSON strings, checked by the routes).
func hashHex(parts ...string) string {
	h := sha256.New()
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// idKey is the key in broadcast_provider_ids of provider id of account's
// sends. Provider ids are hashed: a wamid holds '=' and '+', which are not
// valid in keys, and their length is the provider's.
func idKey(account, id string) string { return "id." + account + "." + hashHex(id) }

// emailKey is the key of an email recipient's most recent SMTP send.
func emailKey(email string) string { return "to." + hashHex(normalizeEmail(email)) }

// normalizeEmail is the form bounces are matched by: trimmed, lower case.
func normalizeEmail(email string) string { return strings.ToLower(strings.TrimSpace(email)) }

// indexEntry is the value under a key of broadcast_provider_ids: which
// recipient of which task the message was, and its attempt, so the receipt's
// event has the same identity as the sent event.
type indexEntry struct {
	TaskID     string `json:"task_id"`
	JobID      string `json:"job_id"`
	Index      int    `json:"index"`
	Account    string `json:"account"`
	Attempt    int    `json:"attempt"`
	Generation int    `json:"generation,omitempty"`
	// DigestSize, on a digest carrier's entry, is how many recipients its
	// message carried: the others' entries are under the same key plus
	// ".<hash of their job id>" (digestItemKey).
	DigestSize int `json:"digest_size,omitempty"`
}

// digestItemKey is where the entry of a digest item, carried by the
// message under key, is kept.
func digestItemKey(key, jobID string) string { return key + "." + hashHex(jobID)[:16] }
