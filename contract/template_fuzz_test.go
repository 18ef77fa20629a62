package contract

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzTemplate parses and executes arbitrary templates the way render does
// (missingkey=error, defaults merged with vars plus "to"). Nothing may
// panic; an execution ends within its time budget (plus slack for a busy
// machine); output never exceeds MaxBodyBytes; errors carry a message; one
// execution allocates at most maxFuzzAllocPerRender (the builtins may build
// MaxTemplateBuiltBytes, the output is at most MaxBodyBytes, and the rest is
// text/template's own garbage, a few hundred bytes a step: the seeds'
// worst is 20 MB).
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
		`{{printf "%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d%4096d" 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1}}`,
		`{{printf "%*d" 999999 1}}{{printf "%.*f" 4000 1e300}}`,
		`{{$s := print .name}}{{range 100}}{{$s = print $s $s}}{{end}}`,
		`{{range 1000}}{{$x := printf "%4000s" "x"}}{{end}}`,
		`{{range 100000}}{{$x := html .name}}{{end}}`,
		`{{printf "%s%w%w%w%w%w%w%w%w%w" .list}}{{printf "%[1]4000s%[1]4000s%[1]4000s" .name}}`,
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
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start = time.Now()
		out, err := tmpl.Render(defaults, vars, "+8613800000001")
		elapsed := time.Since(start)
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > maxFuzzAllocPerRender {
			t.Fatalf("one execution allocated %d bytes (%v)", alloc, err)
		}
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

// maxFuzzAllocPerRender bounds what one execution in FuzzTemplate may
// allocate.
const maxFuzzAllocPerRender = 256 << 20

// FuzzPrintfBound checks the bound printf is held to before it formats:
// for any format and operands, fmt.Sprintf writes no more than printfBound
// says (when it says anything at all: an error refuses the call).
//
// CI runs go test -run='^$' -fuzz='^FuzzPrintfBound$' -fuzztime=10s ./shared
func FuzzPrintfBound(f *testing.F) {
	for _, s := range []string{
		"%d %s %v %q %x % #x %+q %#v %T %p %c %U %#U %e %.3g %f %b %o %O",
		"%[2]*[1]d %[3]*.[2]*[1]f %[5]d %[-1]d %[x]d %[1]",
		"%!%%%-10s|%010.3f|%+.2e|%*s|%.*s|%-*d",
		"%w%w%w %s%w", "%", "%[1]", "%.", "%4096.4096f", "%[1]4096s%[1]4096s", "%*[1]d",
		"%x%X%#x%# x", "%999d%#999v%999q", "%v%v%v%v%v%v%v", "%12s%-12q%12v", // width counts runes
	} {
		f.Add(s, "Li <&>\x00\xff\u2028é😀", 7)
	}
	f.Fuzz(func(t *testing.T, format, s string, n int) {
		args := []any{s, n, float64(n) * 1.5e300, -n, nil, true, []any{s, n, 1.5, nil},
			map[string]any{"k": s, "n": []any{s}}, 1i, uint8(n), []byte(s)}
		for _, k := range []int{0, 1, 2, 5, len(args)} {
			bound, err := printfBound(format, args[:k], 1<<20)
			if err != nil {
				if !strings.HasPrefix(err.Error(), "printf: ") {
					t.Fatalf("error %q", err)
				}
				continue
			}
			if bound > 1<<20 {
				continue // refused, not formatted
			}
			if got := len(fmt.Sprintf(format, args[:k]...)); got > bound {
				t.Fatalf("Sprintf(%q) with %d operands wrote %d bytes, bound %d", format, k, got, bound)
			}
		}
	})
}
