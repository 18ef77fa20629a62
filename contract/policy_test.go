package contract

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDecodePolicyErrorsNameTheField: every bad value is refused with the
// field it is in.
func TestDecodePolicyErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ value, err string }{
		{`{"frequency_caps":[{"max":2,"window":"a day"}]}`, `frequency_caps[0].window: want a Go duration`},
		{`{"frequency_caps":[{"max":2,"window":"24h"},{"max":0,"window":"1h"}]}`, `frequency_caps[1].max: must be at least 1, got 0`},
		{`{"frequency_caps":[{"max":2,"window":"-1h"}]}`, `frequency_caps[0].window: must be above 0`},
		{`{"frequency_caps":[{"max":2,"window":"800h"}]}`, `frequency_caps[0].window: must be above 0 and at most 744h0m0s`},
		{`{"frequency_caps":[{"category":"promo","max":2,"window":"1h"}]}`, `frequency_caps[0].category: must be marketing or utility`},
		{`{"frequency_caps":[{"categories":["transactional"],"max":2,"window":"1h"}]}`, `frequency_caps[0].categories[0]: transactional messages bypass`},
		{`{"quiet_hours":{"start":"9pm","end":"09:00"}}`, `quiet_hours.start: want HH:MM`},
		{`{"quiet_hours":{"start":"21:00","end":"24:30"}}`, `quiet_hours.end: want HH:MM`},
		{`{"quiet_hours":{"start":"21:00","end":"21:00"}}`, `quiet_hours.end: equals start`},
		{`{"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Mars/Olympus"}}`, `quiet_hours.default_tz: unknown time zone "Mars/Olympus"`},
		{`{"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Local"}}`, `quiet_hours.default_tz: unknown time zone "Local"`},
		{`{"quiet_hours":{"start":"21:00","end":"09:00","categories":["x"]}}`, `quiet_hours.categories[0]: must be marketing or utility`},
		{`{"frequency_cap":[]}`, `unknown field "frequency_cap"`},
	} {
		_, err := DecodePolicy([]byte(tc.value))
		require.Error(t, err, tc.value)
		require.Contains(t, err.Error(), tc.err, tc.value)
	}
	p, err := DecodePolicy([]byte(`{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"},{"max":6,"window":"168h"}],` +
		`"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`))
	require.NoError(t, err)
	require.Len(t, p.FrequencyCaps, 2)
	require.Equal(t, 168*time.Hour, p.FrequencyCaps[1].WindowDuration())
	require.Equal(t, "Asia/Shanghai", p.QuietHours.DefaultLocation().String())
}

// TestPolicyCategories: a rule without categories applies to all but
// transactional; one naming marketing applies to marketing only.
func TestPolicyCategories(t *testing.T) {
	t.Parallel()
	p, err := DecodePolicy([]byte(`{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"},{"max":6,"window":"168h"}],` +
		`"quiet_hours":{"start":"21:00","end":"09:00"}}`))
	require.NoError(t, err)
	got := map[Category][3]bool{}
	for _, c := range Categories {
		got[c] = [3]bool{p.FrequencyCaps[0].Applies(c), p.FrequencyCaps[1].Applies(c), p.QuietHours.Applies(c)}
	}
	require.Equal(t, map[Category][3]bool{
		CategoryMarketing:     {true, true, true},
		CategoryUtility:       {false, true, true},
		CategoryTransactional: {false, false, false},
	}, got)
	require.Equal(t, "marketing: 2 per 24h0m0s", p.FrequencyCaps[0].Describe())
	require.Equal(t, "all but transactional: 6 per 168h0m0s", p.FrequencyCaps[1].Describe())
}

// TestQuietHoursUntil: a window across midnight and one within a day, read
// in the recipient's zone, end at the next End.
func TestQuietHoursUntil(t *testing.T) {
	t.Parallel()
	sh, err := time.LoadLocation("Asia/Shanghai")
	require.NoError(t, err)
	night := &QuietHours{Start: "21:00", End: "09:00"}
	require.NoError(t, night.validate())
	at := func(h, m int) time.Time { return time.Date(2026, 12, 2, h, m, 0, 0, sh) }
	for _, tc := range []struct {
		now    time.Time
		inside bool
		end    time.Time
	}{
		{at(3, 0), true, at(9, 0)},
		{at(21, 0), true, time.Date(2026, 12, 3, 9, 0, 0, 0, sh)},
		{at(23, 59), true, time.Date(2026, 12, 3, 9, 0, 0, 0, sh)},
		{at(8, 59), true, at(9, 0)},
		{at(9, 0), false, time.Time{}},
		{at(20, 59), false, time.Time{}},
	} {
		// The same instant given in UTC reads the same in Shanghai.
		end, inside := night.Until(tc.now.UTC(), sh)
		require.Equal(t, tc.inside, inside, tc.now)
		require.True(t, end.Equal(tc.end), "%s: end %s, want %s", tc.now, end, tc.end)
	}
	lunch := &QuietHours{Start: "12:00", End: "13:30"}
	require.NoError(t, lunch.validate())
	end, inside := lunch.Until(at(12, 45), sh)
	require.True(t, inside)
	require.True(t, end.Equal(at(13, 30)))
	_, inside = lunch.Until(at(13, 30), sh)
	require.False(t, inside)
	require.Equal(t, "UTC", lunch.DefaultLocation().String())
}
