package contract

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostileTemplates checks that every template that would spin, recurse
// or grow without bound is refused, at parse time when that is decidable,
// else by the execution budget, each with its reason and quickly.
func TestHostileTemplates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, src  string
		parseError string // expected from ParseTemplate; "" when it parses
		renderErr  error  // expected from Render when it parses
		vars       map[string]any
	}{
		{name: "range over a huge constant", src: `{{range 1000000000}}{{end}}`, parseError: "range over 1000000000 exceeds the limit of 100000 loop iterations"},
		{name: "range over a huge float constant", src: `{{range $i := 1e12}}{{end}}`, parseError: "range over 1000000000000 exceeds"},
		{name: "nested ranges without output", src: `{{range 100000}}{{range 100000}}{{end}}{{end}}`, renderErr: ErrRenderSteps},
		{name: "range over a huge variable", src: `{{range .n}}{{end}}`, vars: map[string]any{"n": 1_000_000_000}, renderErr: ErrRenderSteps},
		{name: "range over a computed length", src: `{{range (len (printf "%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d%4000d" 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1))}}{{range 10}}{{end}}{{end}}`, renderErr: ErrRenderSteps},
		{name: "self recursion", src: `{{define "a"}}{{template "a" .}}{{end}}{{template "a" .}}`, parseError: `template "a" calls itself`},
		{name: "mutual recursion", src: `{{define "a"}}{{template "b"}}{{end}}{{define "b"}}x{{template "a"}}{{end}}{{template "a"}}`, parseError: "calls itself"},
		{name: "exponential fan-out", src: fanOut(40), renderErr: ErrRenderSteps},
		{name: "doubling a value", src: `{{$s := "xx"}}{{range 64}}{{$s = print $s $s}}{{end}}`, renderErr: nil /* checked below */},
		{name: "huge printf width", src: `{{printf "%999999d" 1}}`, parseError: "printf: width 999999 exceeds the limit of 4096"},
		{name: "huge printf width from an argument", src: `{{printf "%*d" .n 1}}`, vars: map[string]any{"n": 999999}, renderErr: ErrTemplateCost},
		{name: "printf result over the limit", src: `{{printf "%4000d" .list}}`, vars: map[string]any{"list": make([]any, 20)}, renderErr: ErrTemplateCost},
		{name: "too many arguments", src: `{{print` + strings.Repeat(" 1", 300) + `}}`, parseError: "print: 300 arguments, limit is 256"},
		{name: "strings built in a loop", src: `{{range 1000}}{{$x := printf "%4000s" "x"}}{{end}}`, renderErr: ErrTemplateCost},
		{name: "huge output", src: `{{range 100000}}0123456789{{end}}`, renderErr: ErrBodyTooLarge},
		{name: "deep nesting", src: strings.Repeat("{{if 1}}", 2000) + "x" + strings.Repeat("{{end}}", 2000)},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			tmpl, err := ParseTemplate(c.src)
			if c.parseError != "" {
				require.ErrorContains(t, err, c.parseError)
				return
			}
			require.NoError(t, err)
			out, err := tmpl.Render(nil, c.vars, "to")
			elapsed := time.Since(start)
			t.Logf("%s: %v in %s", c.name, err, elapsed.Round(time.Microsecond))
			switch {
			case c.name == "doubling a value":
				require.EqualError(t, err, "print: result would exceed 65536 bytes")
				require.ErrorIs(t, err, ErrTemplateCost)
			case c.renderErr == ErrRenderSteps:
				// Whichever budget runs out first: steps, or time on a busy machine.
				require.True(t, errors.Is(err, ErrRenderSteps) || errors.Is(err, ErrRenderTimeout), "got %v", err)
			case c.renderErr != nil:
				require.ErrorIs(t, err, c.renderErr)
			default:
				require.NoError(t, err)
				require.Equal(t, "x", out)
			}
			require.Less(t, elapsed, MaxRenderTime+2*time.Second, "a hostile template is stopped quickly")
		})
	}
}

// fanOut builds templates t0..tn where each calls the next twice: 2^n calls.
func fanOut(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(`{{define "t` + itoa(i) + `"}}{{template "t` + itoa(i+1) + `"}}{{template "t` + itoa(i+1) + `"}}{{end}}`)
	}
	b.WriteString(`{{define "t` + itoa(n) + `"}}{{end}}{{template "t0"}}`)
	return b.String()
}

// TestRenderTimeout checks the wall-clock budget: a loop whose steps are each
// slow (comparing 60 KB strings 40 times, which builds nothing) stops after
// MaxRenderTime.
func TestRenderTimeout(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseTemplate(`{{$s := print .a}}{{$t := print .b}}{{range 90000}}{{if eq $s` + strings.Repeat(" $t", 40) + `}}{{end}}{{end}}`)
	require.NoError(t, err)
	start := time.Now()
	a := strings.Repeat(" ", 60_000)
	_, err = tmpl.Render(map[string]any{"a": a + "1", "b": a + "2"}, nil, "to")
	elapsed := time.Since(start)
	t.Logf("slow loop: %v after %s", err, elapsed.Round(time.Millisecond))
	require.ErrorIs(t, err, ErrRenderTimeout)
	require.Equal(t, "execution exceeded 1s", err.Error())
	require.Less(t, elapsed, MaxRenderTime+500*time.Millisecond)
}

// TestRenderBudgetsAreIndependent renders a costly but legal template again
// and again, and from several goroutines at once: each execution has its own
// step count (together they take far more than MaxTemplateSteps).
func TestRenderBudgetsAreIndependent(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseTemplate(`{{range 30000}}{{end}}ok {{.to}}`)
	require.NoError(t, err)
	for i := range 8 {
		out, err := tmpl.Render(nil, nil, itoa(i))
		require.False(t, errors.Is(err, ErrRenderSteps), "render %d: %v", i, err)
		if err == nil {
			require.Equal(t, "ok "+itoa(i), out)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			_, err := tmpl.Render(nil, nil, itoa(i))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// On a busy machine the clock may run out; the step count must not.
		require.False(t, errors.Is(err, ErrRenderSteps), "%v", err)
	}
}

// TestValidateRejectsCostlyTemplates checks a task whose template breaks a
// limit for its first recipient is rejected with the reason.
func TestValidateRejectsCostlyTemplates(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for src, want := range map[string]string{
		`{{range 1000000000}}{{end}}`:                  "template: range over 1000000000 exceeds the limit",
		`{{range .n}}{{end}}`:                          "template: execution exceeded ",
		`{{range 100000}}0123456789{{end}}`:            "template: rendered message exceeds 65536 bytes",
		`{{define "a"}}{{template "a"}}{{end}}x`:       `template: template "a" calls itself`,
		`Hi {{.name}} (a missing variable only skips)`: "",
	} {
		task := &Task{ID: "t", Channel: "webhook", Template: src,
			Recipients: []Recipient{{To: "a", Vars: map[string]any{"n": 1 << 40}}}}
		task.Normalize()
		err := task.Validate(now)
		if want == "" {
			require.NoError(t, err, src)
			continue
		}
		require.ErrorContains(t, err, want, src)
	}
}
