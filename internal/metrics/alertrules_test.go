package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// alertRules is the shape of a Prometheus rule file.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRules parses deploy/prometheus/alerts.yml as Prometheus would
// read its structure (promtool is not installable from the module proxy
// without the whole Prometheus module): every rule has a unique name, an
// expression whose parentheses and braces balance, a valid for, a
// severity and a summary, and every broadcast_* metric it names is one
// this package defines.
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	var rules alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rules))
	require.NotEmpty(t, rules.Groups)

	defined := definedMetrics(t)
	metricName := regexp.MustCompile(`\bbroadcast_[a-z_]+\b`)
	seen := map[string]bool{}
	n := 0
	for _, g := range rules.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			n++
			require.Regexp(t, `^[A-Z][A-Za-z]+$`, r.Alert)
			require.False(t, seen[r.Alert], "alert %s defined twice", r.Alert)
			seen[r.Alert] = true
			require.NotEmpty(t, r.Expr, r.Alert)
			require.True(t, balanced(r.Expr), "%s: unbalanced brackets in %q", r.Alert, r.Expr)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				require.NoError(t, err, "%s: for", r.Alert)
			}
			require.Contains(t, []string{"info", "warning", "critical"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			names := metricName.FindAllString(r.Expr, -1)
			require.NotEmpty(t, names, "%s names a metric of Broadcast", r.Alert)
			for _, m := range names {
				require.True(t, defined[m], "%s: metric %s is not defined in internal/metrics", r.Alert, m)
			}
		}
	}
	// The conditions status alerts on through ALERT_URL are all there.
	for _, want := range []string{"BroadcastTaskEndedPartialOrFailed", "BroadcastCircuitBreakerPaused",
		"BroadcastAccountPaused", "BroadcastDeadLettersPilingUp", "BroadcastAccountQualityDropped"} {
		require.True(t, seen[want], "rule %s", want)
	}
	require.Equal(t, 9, n)
}

// definedMetrics are the metric names this package's sources define
// (namespace broadcast), with the series names of histograms.
func definedMetrics(t *testing.T) map[string]bool {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	name := regexp.MustCompile(`Name:\s+"([a-z_]+)"`)
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range name.FindAllStringSubmatch(string(src), -1) {
			base := "broadcast_" + m[1]
			for _, suffix := range []string{"", "_bucket", "_count", "_sum"} {
				out[base+suffix] = true
			}
		}
	}
	require.True(t, out["broadcast_tasks"] && out["broadcast_feedback_refused_total"], "found the definitions")
	return out
}

// balanced reports whether (), [] and {} nest properly in expr, outside
// quoted strings.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inQuote := false
	for _, c := range expr {
		switch {
		case c == '"':
			inQuote = !inQuote
		case inQuote:
		case slices.Contains([]rune("([{"), c):
			stack = append(stack, c)
		case pairs[c] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inQuote
}
