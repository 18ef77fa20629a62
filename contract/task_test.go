package contract

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecodeAndValidateNameTheField(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	base := `"id":"t1","channel":"webhook","template":"Hi {{.name}}","recipients":[{"to":"a"}]`
	for _, c := range []struct{ in, want string }{
		{`{` + base + `}`, ""},
		{``, "task: empty message"},
		{`{` + base + `} {}`, "task: unexpected data after the JSON object"},
		{`{"id":7}`, "id: must be string"},
		{`{` + base + `,"max_attempts":"3"}`, "max_attempts: must be int"},
		{`{` + base + `,"extra":1}`, "extra: unknown field"},
		{`{` + base + `,"category":"transactional"}`, ""},
		{`{` + base + `,"category":"promo"}`, `category: must be marketing, utility or transactional, got "promo"`},
		{`{"id":"bad id","channel":"w","template":"x","recipients":[{"to":"a"}]}`, "id: must match"},
		{`{` + base + `,"accounts":["a b"]}`, "accounts[0]: must match"},
		{`{` + base + `,"send_at":"2026-12-02T09:00:00Z","expires_at":"2026-12-02T08:00:00Z"}`, "expires_at: must be after send_at"},
		{`{` + base + `,"send_at":"2026-12-20T23:00:00Z"}`, ""},
		{`{` + base + `,"send_at":"2026-12-21T01:00:00Z"}`, "send_at: is 481h0m0s ahead; a task may be scheduled at most 480h0m0s (20 days) ahead"},
		{`{"id":"t1","channel":"w","template":"` + strings.Repeat("x", MaxTemplateBytes+1) + `","recipients":[{"to":"a"}]}`, "template: is 65537 bytes"},
		{`{"id":"t1","channel":"w","template":"{{if}}","recipients":[{"to":"a"}]}`, "template: "},
		{`{` + base + `,"test_recipients":[` + strings.TrimSuffix(strings.Repeat(`{"to":"q"},`, MaxTestRecipients), ",") + `]}`, ""},
		{`{` + base + `,"test_recipients":[` + strings.TrimSuffix(strings.Repeat(`{"to":"q"},`, MaxTestRecipients+1), ",") + `]}`, "test_recipients: 101 test recipients, limit is 100"},
	} {
		task, err := DecodeTask([]byte(c.in))
		if err == nil {
			task.Normalize()
			err = task.Validate(now)
		}
		if c.want == "" {
			require.NoError(t, err, c.in)
			continue
		}
		require.Error(t, err, c.in)
		require.Contains(t, err.Error(), c.want, c.in)
	}
}

func TestNormalizeDefaults(t *testing.T) {
	t.Parallel()
	task := &Task{}
	task.Normalize()
	require.Equal(t, PriorityNormal, task.Priority)
	require.Equal(t, DefaultMaxAttempts, task.MaxAttempts)
	require.Equal(t, CategoryMarketing, task.Category)
}

func TestTemplateMissingKeyAndLimits(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseTemplate("Hi {{.name}}, code {{.code}} to {{.to}}")
	require.NoError(t, err)
	out, err := tmpl.Render(map[string]any{"code": "D", "name": "Default"}, map[string]any{"name": "Li"}, "+86")
	require.NoError(t, err)
	require.Equal(t, "Hi Li, code D to +86", out)
	_, err = tmpl.Render(nil, map[string]any{"name": "Li"}, "+86")
	require.ErrorContains(t, err, `map has no entry for key "code"`)

	big, err := ParseTemplate(`{{range 100000}}xxxxxxxxxx{{end}}`)
	require.NoError(t, err)
	_, err = big.Render(nil, nil, "a")
	require.ErrorIs(t, err, ErrBodyTooLarge)
}

func TestJobIDRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		task  string
		index int
		test  bool
	}{{"promo-1", 0, false}, {"p_2", 123456, false}, {"x", 7, true}} {
		id := JobID(c.task, c.index, c.test)
		task, index, test, err := ParseJobID(id)
		require.NoError(t, err)
		require.Equal(t, c.task, task)
		require.Equal(t, c.index, index)
		require.Equal(t, c.test, test)
	}
	_, _, _, err := ParseJobID("nodot")
	require.Error(t, err)
}

func TestDecodeAccountDefaultsAndErrors(t *testing.T) {
	t.Parallel()
	a, err := DecodeAccount("hook-a", []byte(`{"channel":"webhook","per_recipient_interval":"6s"}`))
	require.NoError(t, err)
	require.Equal(t, float64(DefaultRatePerSec), a.RatePerSec)
	require.Equal(t, 1, a.Burst)
	require.Equal(t, DefaultConcurrency, a.Concurrency)
	require.Equal(t, 6*time.Second, a.PerRecipientInterval.D())
	require.True(t, a.IsEnabled())
	for in, want := range map[string]string{
		`{}`:                                 "channel: required",
		`{"channel":"w","rate_per_sec":-1}`:  "rate_per_sec: must be above 0 and at most 1e+06, got -1",
		`{"channel":"w","concurrency":5000}`: "concurrency: must be between 1 and 1000",
		`{"channel":"w","burst":"x"}`:        "burst: must be int",
		`{"channel":"w","daily_cap":-2}`:     "daily_cap: must be between 0 (none) and 1000000000, got -2",
		`{"channel":"w","enabled":"yes"}`:    "enabled: must be bool",
		`{"channel":"w","max_batch":-1}`:     "max_batch: must be between 1 and 100000, got -1",
	} {
		_, err := DecodeAccount("a", []byte(in))
		require.ErrorContains(t, err, want, in)
	}
	_, err = DecodeAccount("bad name", []byte(`{"channel":"w"}`))
	require.ErrorContains(t, err, "name: account name must match")
}

// TestDecodeAccountBounds checks every numeric field has an upper bound
// named in its error: absurd values overflowed the pacer (a rate of 1e19
// made its admit window index out of range, crashing dispatch).
func TestDecodeAccountBounds(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"channel":"w","rate_per_sec":1e19}`:                        "rate_per_sec: must be above 0 and at most 1e+06, got 1e+19",
		`{"channel":"w","rate_per_sec":1000001}`:                     "rate_per_sec: must be above 0 and at most 1e+06",
		`{"channel":"w","burst":9223372036854775807}`:                "burst: must be between 1 and 1000000, got 9223372036854775807",
		`{"channel":"w","burst":1e30}`:                               "burst: must be int",
		`{"channel":"w","concurrency":1001}`:                         "concurrency: must be between 1 and 1000, got 1001",
		`{"channel":"w","daily_cap":9223372036854775807}`:            "daily_cap: must be between 0 (none) and 1000000000",
		`{"channel":"w","max_batch":100001}`:                         "max_batch: must be between 1 and 100000, got 100001",
		`{"channel":"w","recover_after":1000001}`:                    "recover_after: must be between 1 and 1000000",
		`{"channel":"w","per_recipient_interval":"200h"}`:            "per_recipient_interval: must be between 0s and 168h0m0s, got 200h0m0s",
		`{"channel":"w","per_recipient_interval":1e19}`:              "per_recipient_interval: duration of 1e+19 seconds is out of range",
		`{"channel":"w","rate_per_sec":10,"min_rate_per_sec":11}`:    "min_rate_per_sec: must be between 0 and rate_per_sec (10), got 11",
		`{"channel":"w","rate_per_sec":10,"min_rate_per_sec":-1e-9}`: "min_rate_per_sec: must be between 0",
	} {
		_, err := DecodeAccount("a", []byte(in))
		require.ErrorContains(t, err, want, in)
	}
	a, err := DecodeAccount("a", []byte(`{"channel":"w","rate_per_sec":1e6,"burst":1000000,"daily_cap":1000000000,"max_batch":100000,"per_recipient_interval":"168h"}`))
	require.NoError(t, err, "the bounds themselves are allowed")
	require.Equal(t, float64(MaxRatePerSec), a.RatePerSec)
}
