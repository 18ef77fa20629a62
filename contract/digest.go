package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"time"
)

// Digests merge the messages of several tasks to one recipient into one
// provider message. Tasks naming the same digest_key for the same
// recipient of the same channel within digest_window of the first are
// sent as one message rendered with DigestTemplate over the merged items;
// each task and recipient still gets its own sent event, which names the
// job whose message carried it (Event.CarriedBy). See docs/digests.md.

// Bounds on the digest fields of a task.
const (
	MinDigestWindow = time.Second
	MaxDigestWindow = 24 * time.Hour
	// MaxDigestTemplateBytes bounds digest_template: every job of the task
	// carries it, so it is kept far below MaxTemplateBytes.
	MaxDigestTemplateBytes = 8 << 10
	// MaxDigestItems bounds the items one digest merges; a task arriving
	// at a full digest opens the next one once it is sent.
	MaxDigestItems = 50
	// DefaultDigestTemplate renders the items' texts one a line.
	DefaultDigestTemplate = "{{range .items}}{{.body}}\n{{end}}"
)

// digestKeyPattern is what a digest_key may be: it is hashed before it is
// used in a key, but a plain word keeps it readable in events and logs.
var digestKeyPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// DigestItem is one merged task's part of a digest, as the digest template
// sees it (.items): its rendered text and which task and job it is.
type DigestItem struct {
	Body   string `json:"body"`
	TaskID string `json:"task_id"`
	JobID  string `json:"job_id"`
}

// DigestData is what a digest template is executed over: .items (each
// with .body, .task_id, .job_id), .count and .to.
func DigestData(items []DigestItem) map[string]any {
	list := make([]any, len(items))
	for i, it := range items {
		list[i] = map[string]any{"body": it.Body, "task_id": it.TaskID, "job_id": it.JobID}
	}
	return map[string]any{"items": list, "count": len(items)}
}

// RenderDigest renders src (DefaultDigestTemplate when empty) over items
// for recipient to.
func RenderDigest(src string, items []DigestItem, to string) (string, error) {
	if src == "" {
		src = DefaultDigestTemplate
	}
	tmpl, err := ParseTemplate(src)
	if err != nil {
		return "", err
	}
	return tmpl.Render(nil, DigestData(items), to)
}

// DigestWindowDuration is the task's digest_window, zero when absent or
// invalid (Validate rejects the latter).
func (t *Task) DigestWindowDuration() time.Duration {
	d, err := time.ParseDuration(t.DigestWindow)
	if err != nil {
		return 0
	}
	return d
}

// validateDigest checks digest_key, digest_window and digest_template.
func (t *Task) validateDigest() error {
	if t.DigestKey == "" {
		switch {
		case t.DigestWindow != "":
			return fieldErr("digest_window", "needs digest_key")
		case t.DigestTemplate != "":
			return fieldErr("digest_template", "needs digest_key")
		}
		return nil
	}
	if !digestKeyPattern.MatchString(t.DigestKey) {
		return fieldErr("digest_key", "must match [A-Za-z0-9_.:-]{1,128}, got %q", truncate(t.DigestKey, 80))
	}
	if t.DigestWindow != "" {
		d, err := time.ParseDuration(t.DigestWindow)
		if err != nil {
			return fieldErr("digest_window", "not a Go duration (e.g. \"10m\"): %q", truncate(t.DigestWindow, 40))
		}
		if d < MinDigestWindow || d > MaxDigestWindow {
			return fieldErr("digest_window", "must be between %s and %s, got %s", MinDigestWindow, MaxDigestWindow, d)
		}
	}
	if len(t.DigestTemplate) > MaxDigestTemplateBytes {
		return fieldErr("digest_template", "is %d bytes, limit is %d", len(t.DigestTemplate), MaxDigestTemplateBytes)
	}
	if t.DigestTemplate != "" {
		tmpl, err := ParseTemplate(t.DigestTemplate)
		if err != nil {
			return fieldErr("digest_template", "%v", err)
		}
		// A trial over two sample items catches a template that names a
		// variable items do not have, before any recipient waits on it.
		sample := []DigestItem{{Body: "a", TaskID: t.ID, JobID: t.ID + ".0"}, {Body: "b", TaskID: t.ID, JobID: t.ID + ".1"}}
		if _, err := tmpl.Render(nil, DigestData(sample), "to"); err != nil {
			return fieldErr("digest_template", "%v (a digest template sees .items with .body, .task_id and .job_id, .count and .to)", err)
		}
	}
	return nil
}

// DigestHash is the hex SHA-256 of s, shortened to 32 characters: how
// recipients and digest keys appear in keys, never raw.
func DigestHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:16])
}
