package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Priority orders work within an account: high overtakes normal and low.
type Priority string

// Priorities, highest first.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Priorities lists every priority, highest first.
var Priorities = []Priority{PriorityHigh, PriorityNormal, PriorityLow}

// Limits on what one task may carry. Larger recipient lists belong in the
// object store (recipients_object).
const (
	MaxTemplateBytes   = 64 << 10
	MaxRecipientBytes  = 256
	MaxInlineRecipents = 200_000
	MaxAttemptsLimit   = 100
	DefaultMaxAttempts = 5
	// MaxScheduleAhead bounds send_at: a task's submission and records are
	// kept 30 days (TopologyConfig.Retention), and a start must leave room
	// within them to send, pause and be approved.
	MaxScheduleAhead = 20 * 24 * time.Hour
	// MaxTestRecipients bounds test_recipients: they are a few people who
	// check the message before the blast, sent and awaited first, not a
	// second recipient list.
	MaxTestRecipients = 100
)

// Recipient is one addressee and the variables its message is rendered with.
type Recipient struct {
	To   string         `json:"to"`
	Vars map[string]any `json:"vars,omitempty"`
}

// Task is what users publish on broadcast.tasks. Times are kept as the
// strings the user sent so validation can name the field that does not parse;
// use SendTime and ExpiryTime for the parsed values.
type Task struct {
	ID               string         `json:"id,omitempty"`
	Channel          string         `json:"channel"`
	Template         string         `json:"template"`
	Defaults         map[string]any `json:"defaults,omitempty"`
	Recipients       []Recipient    `json:"recipients,omitempty"`
	RecipientsObject string         `json:"recipients_object,omitempty"`
	Accounts         []string       `json:"accounts,omitempty"`
	Priority         Priority       `json:"priority,omitempty"`
	SendAt           string         `json:"send_at,omitempty"`
	ExpiresAt        string         `json:"expires_at,omitempty"`
	MaxAttempts      int            `json:"max_attempts,omitempty"`
	TestRecipients   []Recipient    `json:"test_recipients,omitempty"`
	// Category is marketing (the default), utility or transactional:
	// suppression entries apply to the categories they name.
	Category Category `json:"category,omitempty"`
	// DigestKey, DigestWindow (a Go duration) and DigestTemplate merge
	// this task's message to a recipient with other tasks' of the same
	// key into one message (digest.go).
	DigestKey      string `json:"digest_key,omitempty"`
	DigestWindow   string `json:"digest_window,omitempty"`
	DigestTemplate string `json:"digest_template,omitempty"`
}

// FieldError says which field of an input is wrong and why. Its message is
// "field: reason", e.g. "recipients[3].to: must not be empty".
type FieldError struct {
	Field  string
	Reason string
}

// Error bounds both parts: they may quote hostile input (an unknown field
// named with 10 KB, a template error echoing its source), and the message is
// logged and stored in progress.
func (e *FieldError) Error() string {
	reason := truncate(e.Reason, maxReasonBytes)
	if e.Field == "" {
		return reason
	}
	return truncate(e.Field, maxFieldNameBytes) + ": " + reason
}

const (
	maxFieldNameBytes = 200
	maxReasonBytes    = 1000
)

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// DecodeTask parses a task strictly: unknown fields and trailing data are
// errors that name the offending field.
func DecodeTask(data []byte) (*Task, error) {
	if t, ok := decodeTaskFast(data); ok {
		return t, nil
	}
	return decodeTaskStd(data)
}

// decodeTaskStd is DecodeTask with encoding/json, whose errors name the
// field.
func decodeTaskStd(data []byte) (*Task, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &FieldError{Reason: "task: empty message"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var t Task
	if err := dec.Decode(&t); err != nil {
		return nil, jsonFieldError("task", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &FieldError{Reason: "task: unexpected data after the JSON object"}
	}
	return &t, nil
}

// jsonFieldError turns encoding/json errors into FieldErrors naming the field.
func jsonFieldError(what string, err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = what
		}
		return fieldErr(field, "must be %s, not JSON %s", typeErr.Type.String(), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fieldErr(what, "invalid JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return fieldErr(name, "unknown field")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fieldErr(what, "truncated JSON")
	}
	return fieldErr(what, "invalid JSON: %v", err)
}

// Normalize fills defaults that do not depend on configuration.
func (t *Task) Normalize() {
	if t.Priority == "" {
		t.Priority = PriorityNormal
	}
	if t.MaxAttempts == 0 {
		t.MaxAttempts = DefaultMaxAttempts
	}
	if t.Category == "" {
		t.Category = CategoryMarketing
	}
	t.Channel = strings.TrimSpace(t.Channel)
}

// Validate checks everything that can be checked without configuration and
// returns a *FieldError naming the first bad field. Channel and account
// existence are checked by ingest against the account registry.
func (t *Task) Validate(now time.Time) error {
	if !ValidID(t.ID) {
		return fieldErr("id", "must match [A-Za-z0-9_-]{1,64}, got %q", truncate(t.ID, 80))
	}
	if t.Channel == "" {
		return fieldErr("channel", "required")
	}
	if strings.TrimSpace(t.Template) == "" {
		return fieldErr("template", "required")
	}
	if len(t.Template) > MaxTemplateBytes {
		return fieldErr("template", "is %d bytes, limit is %d", len(t.Template), MaxTemplateBytes)
	}
	tmpl, err := ParseTemplate(t.Template)
	if err != nil {
		return fieldErr("template", "%v", err)
	}
	// A trial render with the first recipient rejects, with the reason, a
	// template that breaks a limit (time, steps, size) on its own, instead of
	// letting render spend up to MaxRenderTime on each recipient to skip them
	// all. A missing variable is not a reason: that recipient is skipped.
	if err := trialRender(tmpl, t); err != nil {
		return fieldErr("template", "%v", err)
	}
	switch {
	case len(t.Recipients) == 0 && t.RecipientsObject == "":
		return fieldErr("recipients", "one of recipients or recipients_object is required")
	case len(t.Recipients) > 0 && t.RecipientsObject != "":
		return fieldErr("recipients_object", "give either recipients or recipients_object, not both")
	case len(t.Recipients) > MaxInlineRecipents:
		return fieldErr("recipients", "%d inline recipients, limit is %d: use recipients_object", len(t.Recipients), MaxInlineRecipents)
	}
	if err := validateRecipients("recipients", t.Recipients); err != nil {
		return err
	}
	if len(t.TestRecipients) > MaxTestRecipients {
		return fieldErr("test_recipients", "%d test recipients, limit is %d", len(t.TestRecipients), MaxTestRecipients)
	}
	if err := validateRecipients("test_recipients", t.TestRecipients); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, a := range t.Accounts {
		field := fmt.Sprintf("accounts[%d]", i)
		if !ValidID(a) {
			return fieldErr(field, "must match [A-Za-z0-9_-]{1,64}, got %q", truncate(a, 80))
		}
		if seen[a] {
			return fieldErr(field, "account %q listed twice", a)
		}
		seen[a] = true
	}
	switch t.Priority {
	case PriorityHigh, PriorityNormal, PriorityLow:
	default:
		return fieldErr("priority", "must be high, normal or low, got %q", truncate(string(t.Priority), 40))
	}
	if t.Category != "" && !ValidCategory(t.Category) {
		return fieldErr("category", "must be marketing, utility or transactional, got %q", truncate(string(t.Category), 40))
	}
	if err := t.validateDigest(); err != nil {
		return err
	}
	if t.MaxAttempts < 1 || t.MaxAttempts > MaxAttemptsLimit {
		return fieldErr("max_attempts", "must be between 1 and %d, got %d", MaxAttemptsLimit, t.MaxAttempts)
	}
	sendAt, err := parseOptionalTime("send_at", t.SendAt)
	if err != nil {
		return err
	}
	if ahead := sendAt.Sub(now); ahead > MaxScheduleAhead {
		return fieldErr("send_at", "is %s ahead; a task may be scheduled at most %s (%d days) ahead",
			ahead.Round(time.Hour), MaxScheduleAhead, int(MaxScheduleAhead/(24*time.Hour)))
	}
	expiresAt, err := parseOptionalTime("expires_at", t.ExpiresAt)
	if err != nil {
		return err
	}
	if !expiresAt.IsZero() {
		if !expiresAt.After(now) {
			return fieldErr("expires_at", "%s is already past", t.ExpiresAt)
		}
		if !sendAt.IsZero() && !expiresAt.After(sendAt) {
			return fieldErr("expires_at", "must be after send_at")
		}
	}
	return nil
}

// trialRender renders the template for the first recipient (or with the
// defaults alone) and returns only the errors that say the template itself
// is too costly.
func trialRender(tmpl *Template, t *Task) error {
	var r Recipient
	if len(t.Recipients) > 0 {
		r = t.Recipients[0]
	}
	if _, err := tmpl.Render(t.Defaults, r.Vars, r.To); isLimit(err) {
		return err
	}
	return nil
}

// isLimit reports whether err says the template itself is too costly: it
// broke a limit on time, steps, output or what its builtins build.
func isLimit(err error) bool {
	for _, limit := range []error{ErrRenderTimeout, ErrRenderSteps, ErrBodyTooLarge, ErrTemplateCost} {
		if errors.Is(err, limit) {
			return true
		}
	}
	return false
}

func validateRecipients(field string, rs []Recipient) error {
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			err.Field = fmt.Sprintf("%s[%d].%s", field, i, err.Field)
			return err
		}
	}
	return nil
}

// Validate checks the channel-independent rules for one recipient. The
// returned error's Field is relative to the recipient ("to", "vars").
func (r Recipient) Validate() *FieldError {
	to := strings.TrimSpace(r.To)
	if to == "" {
		return fieldErr("to", "must not be empty")
	}
	if len(r.To) > MaxRecipientBytes {
		return fieldErr("to", "is %d bytes, limit is %d", len(r.To), MaxRecipientBytes)
	}
	return nil
}

func parseOptionalTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fieldErr(field, "must be an RFC 3339 time like 2026-12-01T09:00:00Z, got %q", truncate(s, 60))
	}
	return t, nil
}

// SendTime is send_at parsed, or the zero time when the task sends at once.
func (t *Task) SendTime() time.Time { v, _ := parseOptionalTime("send_at", t.SendAt); return v }

// ExpiryTime is expires_at parsed, or the zero time when the task never expires.
func (t *Task) ExpiryTime() time.Time {
	v, _ := parseOptionalTime("expires_at", t.ExpiresAt)
	return v
}

// truncate cuts s to at most n bytes on a rune boundary and marks the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
