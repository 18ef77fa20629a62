package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// BucketSuppressions is the suppression list: key
// <scope>.<hex SHA-256 of the normalized recipient>, value a Suppression.
// No TTL: an entry stays until it is removed (or, with Until, stops
// suppressing once that time passes).
const BucketSuppressions = "broadcast_suppressions"

// ScopeAll is the scope of an entry that suppresses a recipient on every
// channel; any other scope is a channel name.
const ScopeAll = "all"

// Category says what kind of message a task sends; suppression entries
// (and the policies of DESIGN section 4) apply to the categories they name.
type Category string

// Task categories. A task without one is marketing.
const (
	CategoryMarketing     Category = "marketing"
	CategoryUtility       Category = "utility"
	CategoryTransactional Category = "transactional"
)

// Categories lists every category.
var Categories = []Category{CategoryMarketing, CategoryUtility, CategoryTransactional}

// ValidCategory reports whether c is one of Categories.
func ValidCategory(c Category) bool {
	return c == CategoryMarketing || c == CategoryUtility || c == CategoryTransactional
}

// Suppression reasons. Outside writers may use others; Broadcast writes
// these.
const (
	ReasonOptOut    = "opt_out"
	ReasonBounce    = "bounce"
	ReasonComplaint = "complaint"
	ReasonBlocked   = "blocked"
	ReasonManual    = "manual"
	// ReasonFrequencyCap is a provider's per-user limit (WhatsApp 131049):
	// an entry with Until, holding marketing sends for the provider's window.
	ReasonFrequencyCap = "frequency_cap"
)

// Reasons lists the reasons Broadcast writes and its CLI accepts.
var Reasons = []string{ReasonOptOut, ReasonBounce, ReasonComplaint, ReasonBlocked, ReasonManual, ReasonFrequencyCap}

// CodeSuppressed is the code of the skipped event of a recipient on the
// suppression list.
const CodeSuppressed = "suppressed"

// Suppression is a value of KV broadcast_suppressions.
type Suppression struct {
	// To is the recipient as normalized for the scope (the list is a list
	// of recipients, so it holds them).
	To string `json:"to"`
	// Reason is why: one of Reasons, e.g. opt_out.
	Reason string `json:"reason"`
	// Source is who added it: "cli", "feedback", "import", ...
	Source string `json:"source"`
	// At is when it was added.
	At time.Time `json:"at"`
	// Categories the entry suppresses; empty means every category.
	Categories []Category `json:"categories"`
	// Until, when set, is when the entry stops suppressing (RFC 3339): a
	// hold such as WhatsApp 131049's 24 h, not an opt-out.
	Until *time.Time `json:"until,omitempty"`
}

// Validate checks the entry and names the bad field.
func (s *Suppression) Validate() error {
	if strings.TrimSpace(s.To) == "" {
		return fieldErr("to", "required")
	}
	if len(s.To) > MaxRecipientBytes {
		return fieldErr("to", "is %d bytes, limit is %d", len(s.To), MaxRecipientBytes)
	}
	if s.Reason == "" {
		return fieldErr("reason", "required: one of %s", strings.Join(Reasons, ", "))
	}
	if len(s.Reason) > 64 {
		return fieldErr("reason", "is %d bytes, limit is 64", len(s.Reason))
	}
	for i, c := range s.Categories {
		if !ValidCategory(c) {
			return fieldErr(fmt.Sprintf("categories[%d]", i), "must be marketing, utility or transactional, got %q", truncate(string(c), 40))
		}
	}
	return nil
}

// Covers reports whether the entry suppresses a message of category c at
// now: its categories include c (or are empty) and its Until, if any, is
// still ahead.
func (s *Suppression) Covers(c Category, now time.Time) bool {
	if s.Until != nil && !now.Before(*s.Until) {
		return false
	}
	if len(s.Categories) == 0 {
		return true
	}
	for _, x := range s.Categories {
		if x == c {
			return true
		}
	}
	return false
}

// ValidScope reports whether scope can name a suppression scope: "all" or
// a channel name (a KV key token).
func ValidScope(scope string) bool { return ValidID(scope) }

// RecipientHash is the hex SHA-256 of a normalized recipient.
func RecipientHash(normalizedTo string) string {
	h := sha256.Sum256([]byte(normalizedTo))
	return hex.EncodeToString(h[:])
}

// SuppressionKey is the key of normalizedTo's entry in scope.
func SuppressionKey(scope, normalizedTo string) string {
	return scope + "." + RecipientHash(normalizedTo)
}
