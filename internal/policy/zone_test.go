package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestZone: the tz variable wins, then the phone number's region, then the
// fallback; a tz that names no zone and a recipient that is no phone
// number fall through.
func TestZone(t *testing.T) {
	t.Parallel()
	fallback := time.FixedZone("fallback", 3600)
	for _, tc := range []struct {
		vars       map[string]any
		to         string
		zone, from string
	}{
		{map[string]any{"tz": "Europe/Berlin"}, "+8613800000001", "Europe/Berlin", "tz"},
		{nil, "+8613800000001", "Asia/Shanghai", "phone"},
		{nil, "+441632960961", "Europe/London", "phone"},
		{map[string]any{"tz": "Nowhere/Else"}, "+8613800000001", "Asia/Shanghai", "phone"},
		{map[string]any{"tz": 5}, "user-1", "fallback", "default"},
		{nil, "8613800000001", "fallback", "default"},
		{nil, "li@example.com", "fallback", "default"},
	} {
		loc, from := Zone(tc.vars, tc.to, fallback)
		require.Equal(t, [2]string{tc.zone, tc.from}, [2]string{loc.String(), from}, "%v %s", tc.vars, tc.to)
	}
}

// BenchmarkZone: the zone of a phone number without a tz variable (the
// dearest case: a parse and a prefix lookup), and of a tz variable.
func BenchmarkZone(b *testing.B) {
	b.Run("phone", func(b *testing.B) {
		for b.Loop() {
			Zone(nil, "+8613800000001", time.UTC)
		}
	})
	b.Run("tz", func(b *testing.B) {
		vars := map[string]any{"tz": "Europe/Berlin"}
		for b.Loop() {
			Zone(vars, "+8613800000001", time.UTC)
		}
	})
}
