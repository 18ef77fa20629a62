package ingest

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzReadList feeds arbitrary recipient lists, named .csv, .jsonl or
// without an extension (format sniffed from the first byte), to readList,
// the streaming parser behind recipients_object. Nothing may panic or spin;
// entries come in strictly increasing line order, never more than the input
// has lines; each is either a recipient or carries the reason it is unusable
// (naming its line); and a failure of the whole list is a listError (the
// task is rejected with it) rather than an I/O error.
//
// Seeds: f.Add below plus testdata/fuzz/FuzzReadList. CI runs
// go test -run='^$' -fuzz='^FuzzReadList$' -fuzztime=10s ./services/ingest
func FuzzReadList(f *testing.F) {
	for _, s := range []struct{ name, data string }{
		{"a.jsonl", "{\"to\":\"a\",\"vars\":{\"n\":1}}\n\n{\"to\":\"b\"}\n{bad\n{\"to\":\"c\"}"},
		{"a.csv", "\ufeffname,to,code\nLi,+861,X\n\"Wang, Jr\",+862,Y\nshort\n"},
		{"a.csv", "to\n\"unterminated\nx\n"},
		{"a.csv", "to,to\na,b\n"},
		{"a.csv", "name,phone\nLi,1\n"},
		{"x", "{\"to\":1}\n{\"to\":\"ok\",\"vars\":[]}\n"},
		{"x", "to,a\r\n1,2\r\n"},
		{"a.ndjson", "\x00\xff{\n"},
		{"a.csv", ""},
		{"a.jsonl", strings.Repeat("{\"to\":\"a\"}\n", 50)},
		{"a.csv", "to,\"x\"\"y\"\n\"a\nb\",2\n"},
	} {
		f.Add(s.name, []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		lines := bytes.Count(data, []byte("\n")) + 1
		prev := 0
		entries := 0
		start := time.Now()
		err := readList(bytes.NewReader(data), name, func(e listEntry) error {
			entries++
			if e.Line <= prev {
				t.Fatalf("entry line %d after line %d", e.Line, prev)
			}
			prev = e.Line
			if e.Invalid != "" && !strings.HasPrefix(e.Invalid, "line ") {
				t.Fatalf("reason %q does not name its line", e.Invalid)
			}
			return nil
		})
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("readList took %s on %d bytes", d, len(data))
		}
		if entries > lines {
			t.Fatalf("%d entries from %d lines", entries, lines)
		}
		if err != nil {
			var le *listError
			if !errors.As(err, &le) {
				t.Fatalf("list error is %T, not *listError: %v", err, err)
			}
			if le.Error() == "" {
				t.Fatal("empty list error")
			}
		}
	})
}
