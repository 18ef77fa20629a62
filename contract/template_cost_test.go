package contract

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hostileCost is a template that asks the builtins to build far more than a
// message may hold, with the data it runs over.
type hostileCost struct {
	name, src string
	defaults  map[string]any
}

// hostileCosts are the templates of issue 13 that drove ingest to 809 MB and
// render to 891 MB: wide printf verbs repeated, and a 60 KB string printed
// thousands of times, in one call or kept in many variables.
func hostileCosts() []hostileCost {
	big := strings.Repeat("x", 60_000)
	var out []hostileCost
	// 300 verbs of width 999,999: a 300 MB string in one call.
	out = append(out, hostileCost{name: "printf wide verbs",
		src: `{{printf "` + strings.Repeat("%999999d", 300) + `"` + strings.Repeat(" 1", 300) + `}}`})
	// One 60 KB variable passed 3,000 times: 180 MB in one call.
	out = append(out, hostileCost{name: "print a 60 KB string 3000 times",
		src: `{{$s := .big}}{{print` + strings.Repeat(" $s", 3000) + `}}`, defaults: map[string]any{"big": big}})
	// Widths within the limit, 200 of them: 800 KB.
	out = append(out, hostileCost{name: "printf 200 verbs of width 4096",
		src: `{{printf "` + strings.Repeat("%4096d", 200) + `"` + strings.Repeat(" 1", 200) + `}}`})
	// Within the argument count: 200 times, 12 MB.
	out = append(out, hostileCost{name: "print a 60 KB string 200 times",
		src: `{{$s := .big}}{{print` + strings.Repeat(" $s", 200) + `}}`, defaults: map[string]any{"big": big}})
	// A width given by an argument.
	out = append(out, hostileCost{name: "printf width from an argument",
		src: `{{printf "` + strings.Repeat("%*d", 100) + `"` + strings.Repeat(" 999999 1", 100) + `}}`})
	// Precision instead of width.
	out = append(out, hostileCost{name: "printf huge precision",
		src: `{{printf "` + strings.Repeat("%.999999f", 200) + `"` + strings.Repeat(" 1.5", 200) + `}}`})
	// Each value under the cap, but 2,000 of them kept alive at once.
	var vars strings.Builder
	for i := range 2000 {
		vars.WriteString(`{{$v` + strconv.Itoa(i) + ` := print $.big}}`)
	}
	out = append(out, hostileCost{name: "2000 variables of 60 KB", src: vars.String(), defaults: map[string]any{"big": big}})
	// A 10 KB value escaped to 40 KB in a loop: 100,000 html calls.
	out = append(out, hostileCost{name: "html of 10 KB in a loop",
		src: `{{range 100000}}{{$x := html $.lt}}{{end}}`, defaults: map[string]any{"lt": strings.Repeat("<", 10_000)}})
	return out
}

// costOf parses and runs src once and returns the bytes allocated, the
// growth of the heap's peak in use, and the error (of parsing, when it
// refuses the template, else of rendering).
func costOf(c hostileCost) (alloc, peak uint64, err error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := make(chan struct{})
	peakCh := make(chan uint64)
	go func() { peakCh <- sampleHeapPeak(stop) }()
	tmpl, err := ParseTemplate(c.src)
	if err == nil {
		_, err = tmpl.Render(c.defaults, nil, "+8613800000001")
	}
	close(stop)
	peak = <-peakCh
	runtime.ReadMemStats(&after)
	base := before.HeapAlloc
	if peak < base {
		peak = base
	}
	return after.TotalAlloc - before.TotalAlloc, peak - base, err
}

// sampleHeapPeak polls the live heap every 200 µs until stop closes and
// returns the largest value seen.
func sampleHeapPeak(stop <-chan struct{}) uint64 {
	var peak uint64
	var m runtime.MemStats
	t := time.NewTicker(200 * time.Microsecond)
	defer t.Stop()
	for {
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapAlloc)
		select {
		case <-stop:
			return peak
		case <-t.C:
		}
	}
}

// MaxTemplateCostPerRender is what one execution of any template may
// allocate in the tests: the strings the builtins build
// (MaxTemplateBuiltBytes), the output, and text/template's own work for up
// to MaxTemplateSteps steps.
const maxTemplateCostPerRender = 64 << 20

// TestHostileTemplateCosts renders each hostile template once: it must fail
// with a limit that trialRender treats as the template's own (so intake
// rejects the task), having allocated a bounded amount, never the whole
// string it asked for.
func TestHostileTemplateCosts(t *testing.T) {
	for _, c := range hostileCosts() {
		t.Run(c.name, func(t *testing.T) {
			alloc, peak, err := costOf(c)
			t.Logf("%s: %v; allocated %.2f MB, heap peak +%.2f MB", c.name, err, float64(alloc)/1e6, float64(peak)/1e6)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrTemplateCost, "a cost error, so intake rejects the task")
			require.Less(t, len(err.Error()), 200, "the error does not quote the template")
			require.Less(t, peak, uint64(8<<20), "heap peak of one execution")
			require.Less(t, alloc, uint64(maxTemplateCostPerRender), "allocated by one execution")
		})
	}
}

// TestHostileTemplatesRejectedAtIntake checks Validate rejects a task of two
// recipients with each hostile template, naming the template field, and
// allocates a bounded amount doing so.
func TestHostileTemplatesRejectedAtIntake(t *testing.T) {
	for _, c := range hostileCosts() {
		t.Run(c.name, func(t *testing.T) {
			task := &Task{ID: "t", Channel: "webhook", Template: c.src, Defaults: c.defaults,
				Recipients: []Recipient{{To: "a"}, {To: "b"}}}
			task.Normalize()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := task.Validate(time.Now())
			runtime.ReadMemStats(&after)
			require.Error(t, err)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, "template", fe.Field, "%v", err)
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(maxTemplateCostPerRender), "allocated by Validate")
		})
	}
}

// BenchmarkHostileTemplates reports what one execution of each hostile
// template allocates and how far it raises the heap's and the process's
// peak (VmHWM, Linux):
//
//	go test -run '^$' -bench HostileTemplates -benchtime 1x ./shared
func BenchmarkHostileTemplates(b *testing.B) {
	for _, c := range hostileCosts() {
		b.Run(strings.ReplaceAll(c.name, " ", "_"), func(b *testing.B) {
			hwm0 := peakRSS()
			var alloc, peak uint64
			for b.Loop() {
				a, p, _ := costOf(c)
				alloc, peak = max(alloc, a), max(peak, p)
			}
			b.ReportMetric(float64(alloc)/1e6, "MB-alloc/op")
			b.ReportMetric(float64(peak)/1e6, "MB-heap-peak")
			b.ReportMetric(float64(peakRSS()-hwm0)/1e6, "MB-RSS-peak-growth")
			b.ReportMetric(float64(peakRSS())/1e6, "MB-RSS-peak")
		})
	}
}

// peakRSS is the process's peak resident set (VmHWM) in bytes, 0 when unknown.
func peakRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
