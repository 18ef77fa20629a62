package contract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzDecodeTask feeds arbitrary bytes to DecodeTask, Normalize and Validate,
// as ingest does with every submission. Nothing may panic; every refusal is
// a *FieldError with a message; an accepted task respects the documented
// limits and survives a round trip through JSON; and validating (which
// parses and trial-renders the template) stays fast.
//
// Seeds: f.Add below plus testdata/fuzz/FuzzDecodeTask. CI runs
// go test -run='^$' -fuzz='^FuzzDecodeTask$' -fuzztime=10s ./shared
func FuzzDecodeTask(f *testing.F) {
	base := `"id":"t1","channel":"webhook","template":"Hi {{.name}}","recipients":[{"to":"a","vars":{"name":"Li"}}]`
	for _, s := range []string{
		`{` + base + `}`,
		`{` + base + `,"priority":"high","max_attempts":3,"send_at":"2026-12-01T09:00:00Z","expires_at":"2026-12-02T09:00:00Z"}`,
		`{` + base + `,"accounts":["a","b"],"defaults":{"code":"X"},"test_recipients":[{"to":"qa"}]}`,
		`{"id":"t2","channel":"webhook","template":"x","recipients_object":"lists/a.jsonl"}`,
		`{"channel":"webhook","template":"{{range 1000000000}}{{end}}","recipients":[{"to":"a"}]}`,
		`{"id":"t3","channel":"webhook","template":"{{range .n}}{{end}}","recipients":[{"to":"a","vars":{"n":1e12}}]}`,
		`{"id":"t4","channel":"webhook","template":"{{define \"a\"}}{{template \"a\"}}{{end}}","recipients":[{"to":"a"}]}`,
		`{"id":"t5","channel":"w","template":"x","recipients":[{"to":""}]}`,
		`{"id":7}`, `{}`, `[]`, `null`, ``, `{"id":"x"} {}`, `{"extra":1}`,
		`{"id":"t6","channel":"w","template":"x","recipients":[{"to":"a"}],"max_attempts":1000}`,
		`{"id":"t7","channel":"w","template":"x","recipients":[{"to":"a"}],"send_at":"tomorrow"}`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		task, err := DecodeTask(data)
		if err == nil {
			task.Normalize()
			err = task.Validate(now)
		}
		// Validation parses the template and renders it once: each bounded.
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("decode+validate took %s", d)
		}
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error is %T, not *FieldError: %v", err, err)
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			// Messages quote user input truncated: they stay short enough to
			// log and to store in progress.
			if len(err.Error()) > 2000 {
				t.Fatalf("error message of %d bytes", len(err.Error()))
			}
			return
		}
		// Accepted: the limits hold.
		if !ValidID(task.ID) {
			t.Fatalf("accepted id %q", task.ID)
		}
		if len(task.Template) > MaxTemplateBytes || len(task.Recipients) > MaxInlineRecipents {
			t.Fatalf("accepted a task over the limits: template %d bytes, %d recipients", len(task.Template), len(task.Recipients))
		}
		if task.MaxAttempts < 1 || task.MaxAttempts > MaxAttemptsLimit {
			t.Fatalf("accepted max_attempts %d", task.MaxAttempts)
		}
		for _, r := range append(task.Recipients, task.TestRecipients...) {
			if strings.TrimSpace(r.To) == "" || len(r.To) > MaxRecipientBytes {
				t.Fatalf("accepted recipient %q", r.To)
			}
		}
		if (len(task.Recipients) == 0) == (task.RecipientsObject == "") {
			t.Fatal("accepted a task without exactly one of recipients and recipients_object")
		}
		// Round trip: what ingest stores (the task as JSON) decodes and
		// validates again.
		again, err := json.Marshal(task)
		if err != nil {
			t.Fatalf("marshal accepted task: %v", err)
		}
		t2, err := DecodeTask(again)
		if err != nil {
			t.Fatalf("re-decode %s: %v", again, err)
		}
		t2.Normalize()
		if err := t2.Validate(now); err != nil && utf8.Valid(data) {
			// Invalid UTF-8 is replaced by U+FFFD on the way out, which may
			// legitimately change a length check; valid input must round-trip.
			t.Fatalf("re-validate %s: %v", again, err)
		}
	})
}
