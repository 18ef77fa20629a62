package contract

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWarmupSchedule: the ramp of the contract's example, day by day on a
// fake clock: 50, 70, 98, 137, ... up to max 1000, and the start before
// its first day.
func TestWarmupSchedule(t *testing.T) {
	t.Parallel()
	a, err := DecodeAccount("wa1", []byte(`{"channel":"whatsapp","warmup":{"start":50,"growth":1.4,"max":1000,"since":"2026-12-01"}}`))
	require.NoError(t, err)
	day0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var got []int
	for d := range 11 {
		got = append(got, a.Warmup.CapAt(day0.Add(time.Duration(d)*24*time.Hour+13*time.Hour)))
	}
	t.Logf("warm-up caps for days 0-10: %v", got)
	require.Equal(t, []int{50, 70, 98, 137, 192, 268, 376, 527, 737, 1000, 1000}, got)
	require.Equal(t, 50, a.Warmup.CapAt(day0.Add(-48*time.Hour)), "before since: the start")
	require.Equal(t, 0, a.Warmup.Day(day0.Add(23*time.Hour+59*time.Minute)))
	require.Equal(t, 1, a.Warmup.Day(day0.Add(24*time.Hour)))
	require.Equal(t, 1000, a.Warmup.CapAt(day0.Add(10000*24*time.Hour)), "far out: max, no overflow")
	var none *Warmup
	require.Zero(t, none.CapAt(day0))
}

func TestWarmupAndPortfolioErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for body, field := range map[string]string{
		`{"channel":"x","warmup":{"start":0,"growth":1.4,"since":"2026-12-01"}}`:           "warmup.start",
		`{"channel":"x","warmup":{"start":5,"growth":0.5,"since":"2026-12-01"}}`:           "warmup.growth",
		`{"channel":"x","warmup":{"start":50,"growth":1.4,"max":10,"since":"2026-12-01"}}`: "warmup.max",
		`{"channel":"x","warmup":{"start":50,"growth":1.4,"since":"yesterday"}}`:           "warmup.since",
		`{"channel":"x","warmup":{"start":50,"growth":"fast","since":"2026-12-01"}}`:       "warmup.growth",
		`{"channel":"x","portfolio":"a b"}`:                                                "portfolio",
	} {
		_, err := DecodeAccount("a", []byte(body))
		require.Error(t, err, body)
		require.True(t, strings.Contains(err.Error(), field), "%s: %v", body, err)
	}
}

func TestAccountSignalsDecode(t *testing.T) {
	t.Parallel()
	s, err := DecodeAccountSignals([]byte(`{"quality":"yellow","messaging_limit":2000}`))
	require.NoError(t, err)
	require.Equal(t, QualityYellow, s.Quality)
	require.Equal(t, 0.5, s.RateFactor())
	require.False(t, s.HoldsMarketing())
	_, err = DecodeAccountSignals([]byte(`{"quality":"PURPLE"}`))
	require.ErrorContains(t, err, "quality")
	_, err = DecodeAccountSignals([]byte(`{"messaging_limit":-5}`))
	require.ErrorContains(t, err, "messaging_limit")
	var none *AccountSignals
	require.Equal(t, 1.0, none.RateFactor())
	require.Equal(t, QualityUnknown, none.QualityOrUnknown())
	limit, ok := WhatsAppLimitTier("tier_unlimited")
	require.True(t, ok)
	require.Equal(t, MessagingLimitUnlimited, limit)
	_, ok = WhatsAppLimitTier("TIER_NOT_SET")
	require.False(t, ok)
}

// TestHealthScore: each factor of the rule moves the score as stated.
func TestHealthScore(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    AccountScore
		want int
	}{
		{AccountScore{}, 100},
		{AccountScore{Sent: 100, Delivered: 90, Undelivered: 10, Attempts: 100}, 90},
		{AccountScore{Sent: 100, Delivered: 5, Undelivered: 4, Attempts: 100}, 100}, // too few receipts
		{AccountScore{Sent: 100, Blocked: 5, Attempts: 100}, 50},
		{AccountScore{Sent: 100, Blocked: 20, Attempts: 100}, 0},
		{AccountScore{Sent: 100, Attempts: 125, RateLimited: 25}, 60},
		{AccountScore{Sent: 100, Attempts: 100, Quality: QualityYellow}, 70},
		{AccountScore{Sent: 100, Delivered: 80, Undelivered: 20, Attempts: 100, Quality: QualityRed}, 24},
	} {
		require.Equal(t, c.want, HealthScore(c.s), "%+v", c.s)
	}
}
