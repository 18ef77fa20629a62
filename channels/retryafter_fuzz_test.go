package channels

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseRetryAfter feeds arbitrary header values to ParseRetryAfter. It
// may refuse a value, but an accepted one is never negative nor above
// MaxRetryAfter, agrees with the delta-seconds or HTTP-date reading of the
// value, and never panics (NaN, Inf, huge exponents, odd dates).
//
// Seeds: f.Add below plus testdata/fuzz/FuzzParseRetryAfter. CI runs
// go test -run='^$' -fuzz='^FuzzParseRetryAfter$' -fuzztime=10s ./channels
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "1.5", " 120 ", "-1", "NaN", "Inf", "-Inf", "+Inf", "1e400", "1e-400", "86401", "0x10",
		"9223372036854775807", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		"Fri, 31 Dec 9999 23:59:59 GMT", "garbage", "1 2", "٣",
	} {
		f.Add(s)
	}
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if !ok {
			if d != 0 {
				t.Fatalf("refused %q but returned %s", v, d)
			}
			return
		}
		if d < 0 || d > MaxRetryAfter {
			t.Fatalf("%q -> %s, outside [0, %s]", v, d, MaxRetryAfter)
		}
		trimmed := strings.TrimSpace(v)
		if secs, err := strconv.ParseFloat(trimmed, 64); err == nil {
			want := math.Min(secs, MaxRetryAfter.Seconds())
			if math.Abs(d.Seconds()-want) > 1e-6*math.Max(1, want) {
				t.Fatalf("%q -> %s, want %gs", v, d, want)
			}
			return
		}
		at, err := http.ParseTime(trimmed)
		if err != nil {
			t.Fatalf("accepted %q, which is neither seconds nor an HTTP date", v)
		}
		want := min(max(at.Sub(now), 0), MaxRetryAfter)
		if d != want {
			t.Fatalf("%q -> %s, want %s", v, d, want)
		}
	})
}
