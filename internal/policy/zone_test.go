package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestZone: the recipient's tz variable wins, then the task's defaults
// tz, then the phone number's region, then the fallback; a tz that names
// no zone (the recipient's or the task's) and a recipient that is no
// phone number fall through.
func TestZone(t *testing.T) {
	t.Parallel()
	fallback := time.FixedZone("fallback", 3600)
	for _, tc := range []struct {
		vars       map[string]any
		taskTZ     string
		to         string
		zone, from string
	}{
		{map[string]any{"tz": "Europe/Berlin"}, "", "+8613800000001", "Europe/Berlin", "tz"},
		{map[string]any{"tz": "Europe/Berlin"}, "America/New_York", "+8613800000001", "Europe/Berlin", "tz"},
		{nil, "America/New_York", "+8613800000001", "America/New_York", "defaults.tz"},
		{map[string]any{"tz": "Nowhere/Else"}, "America/New_York", "user-1", "America/New_York", "defaults.tz"},
		{nil, "Nowhere/Else", "+8613800000001", "Asia/Shanghai", "phone"},
		{nil, "", "+8613800000001", "Asia/Shanghai", "phone"},
		{nil, "", "+441632960961", "Europe/London", "phone"},
		{map[string]any{"tz": "Nowhere/Else"}, "", "+8613800000001", "Asia/Shanghai", "phone"},
		{map[string]any{"tz": 5}, "", "user-1", "fallback", "default"},
		{nil, "Local", "user-1", "fallback", "default"},
		{nil, "", "8613800000001", "fallback", "default"},
		{nil, "", "li@example.com", "fallback", "default"},
	} {
		loc, from := Zone(tc.vars, tc.taskTZ, tc.to, fallback)
		require.Equal(t, [2]string{tc.zone, tc.from}, [2]string{loc.String(), from}, "%v %q %s", tc.vars, tc.taskTZ, tc.to)
	}
}

// BenchmarkZone: the zone of a phone number without a tz variable (the
// dearest case: a parse and a prefix lookup), and of a tz variable.
func BenchmarkZone(b *testing.B) {
	b.Run("phone", func(b *testing.B) {
		for b.Loop() {
			Zone(nil, "", "+8613800000001", time.UTC)
		}
	})
	b.Run("tz", func(b *testing.B) {
		vars := map[string]any{"tz": "Europe/Berlin"}
		for b.Loop() {
			Zone(vars, "", "+8613800000001", time.UTC)
		}
	})
}
