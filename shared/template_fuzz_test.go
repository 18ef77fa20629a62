package shared

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzTemplate parses and executes arbitrary templates the way render does
// (missingkey=error, defaults merged with vars plus "to"). Nothing may
// panic; an execution ends within its time budget (plus slack for a busy
// machine); output never exceeds MaxBodyBytes; errors carry a message.
//
// Seeds: f.Add below plus testdata/fuzz/FuzzTemplate (hostile templates:
// huge output, deep nesting, long and nested loops, recursion, doubling).
// CI runs go test -run='^$' -fuzz='^FuzzTemplate$' -fuzztime=10s ./shared
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"Hi {{.name}}, your code is {{.code}}",
		"{{.to}}{{if .vip}} VIP{{else}} -{{end}}",
		`{{range $i, $e := .list}}{{$i}}={{$e}};{{end}}`,
		`{{with .missing}}x{{end}}`,
		`{{printf "%05d|%q" .n .name}}`,
		`{{range 1000000000}}{{end}}`,
		`{{range 100000}}{{range 100000}}{{end}}{{end}}`,
		`{{range 100000}}0123456789{{end}}`,
		`{{define "a"}}{{template "a"}}{{end}}{{template "a"}}`,
		`{{$s := "ab"}}{{range 60}}{{$s = print $s $s}}{{end}}{{len $s}}`,
		`{{printf "%999999d" 1}}`,
		strings.Repeat("{{if 1}}", 500) + "deep" + strings.Repeat("{{end}}", 500),
		strings.Repeat("(", 200),
		`{{block "b" .}}{{.name}}{{end}}`,
		`{{html .name}}{{js .name}}{{urlquery .name}}{{len .list}}{{index .list 1}}{{slice .name 1}}`,
		`{{broadcastStep}}{{call .name}}`,
		`{{range .n}}{{.}}{{break}}{{end}}`,
	} {
		f.Add(s)
	}
	defaults := map[string]any{"code": "X-1", "n": 7}
	vars := map[string]any{"name": "Li <&>", "list": []any{"a", "b", "c"}, "vip": true}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > MaxTemplateBytes {
			return // Validate refuses these before parsing
		}
		start := time.Now()
		tmpl, err := ParseTemplate(src)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty parse error")
			}
			return
		}
		parsed := time.Since(start)
		start = time.Now()
		out, err := tmpl.Render(defaults, vars, "+8613800000001")
		elapsed := time.Since(start)
		// The budget is MaxRenderTime; the clock is read every 64 steps and
		// the fuzzer runs several workers, so allow generous slack.
		if elapsed > MaxRenderTime+time.Second {
			t.Fatalf("render took %s (parse %s)", elapsed, parsed)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty render error")
			}
			return
		}
		if len(out) > MaxBodyBytes {
			t.Fatalf("output of %d bytes", len(out))
		}
		// The plain fast path writes exactly what executing writes.
		if tmpl.plain != nil {
			if plain, ok := renderPlain(tmpl.plain, defaults, vars, "+8613800000001"); ok {
				exec, err := tmpl.execute(defaults, vars, "+8613800000001")
				if err != nil || exec != plain {
					t.Fatalf("plain %q, executed %q (%v)", plain, exec, err)
				}
			}
		}
		if strings.Contains(out, "<no value>") && !strings.Contains(src, "<no value>") && utf8.ValidString(src) {
			t.Fatalf("rendered <no value>: %q", out)
		}
	})
}
