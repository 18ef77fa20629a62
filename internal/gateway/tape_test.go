package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTapePlayback plays a tape: each key gets its recorded answer per
// attempt, keys and attempts without one fall back to 200, and the ledger
// counts what was played.
func TestTapePlayback(t *testing.T) {
	t.Parallel()
	tape := &Tape{Task: "t", Answers: []TapeAnswer{
		{Key: "t.0", Attempt: 1, Status: 503},
		{Key: "t.0", Attempt: 2, Status: 429, RetryAfter: 2 * time.Second},
		{Key: "t.0", Attempt: 3, Status: 200, Latency: 30 * time.Millisecond},
		{Key: "t.1", Attempt: 1, Status: 400},
		{Key: "t.2", Attempt: 1, Status: 401},
		{Key: "t.3", Attempt: 1, Status: 429},
	}}
	b := setup(t, Config{Tape: tape, Seed: 1})
	a := b.send(t, msg("t.0", "a", "acct", 1))
	require.Equal(t, http.StatusServiceUnavailable, a.status)
	a = b.send(t, msg("t.0", "a", "acct", 2))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, "2", a.retryAfter)
	start := time.Now()
	a = b.send(t, msg("t.0", "a", "acct", 3))
	require.Equal(t, http.StatusOK, a.status)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "the recorded latency is played")
	require.Equal(t, http.StatusBadRequest, b.send(t, msg("t.1", "b", "acct", 1)).status)
	require.Equal(t, http.StatusUnauthorized, b.send(t, msg("t.2", "c", "acct", 1)).status)
	a = b.send(t, msg("t.3", "d", "acct", 1))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Empty(t, a.retryAfter, "a 429 recorded without Retry-After is played without one")
	require.Equal(t, http.StatusOK, b.send(t, msg("t.1", "b", "acct", 2)).status, "an attempt not on the tape is accepted")
	require.Equal(t, http.StatusOK, b.send(t, msg("t.9", "z", "acct", 1)).status, "a key not on the tape is accepted")
	l := b.g.Ledger()
	checkInvariants(t, l)
	require.Equal(t, 3, l.Accepted)
	require.Equal(t, map[string]int{"503": 1, "429": 2, "504": 0, "400": 1, "401": 1}, l.Injected)
}

// TestTapeJSONRoundTrip reads back a tape written as JSON and refuses a bad
// one naming the field.
func TestTapeJSONRoundTrip(t *testing.T) {
	t.Parallel()
	in := Tape{Task: "t", Answers: []TapeAnswer{{Key: "t.0", To: "a", Account: "h", Attempt: 1, Order: 1, Status: 429, Code: "429", RetryAfter: time.Second, Latency: 5 * time.Millisecond, Kind: "retrying"}}}
	raw, err := json.Marshal(in)
	require.NoError(t, err)
	out, err := ReadTape(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Equal(t, in, *out)
	_, err = ReadTape(bytes.NewReader([]byte(`{"answers":[{"key":"k","attempt":0,"status":200}]}`)))
	require.ErrorContains(t, err, "answers[0].attempt")
	_, err = New(Config{Tape: &Tape{Answers: []TapeAnswer{{Key: "k", Attempt: 1, Status: 42}}}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "answers[0].status")
}

// TestUnauthorizedAndNoRetryAfter covers the all-401 switch and 429s
// without Retry-After.
func TestUnauthorizedAndNoRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Unauthorized: true})
	require.Equal(t, http.StatusUnauthorized, b.send(t, msg("k", "a", "acct", 1)).status)
	require.Equal(t, 1, b.g.Ledger().Injected["401"])

	b = setup(t, Config{RateLimitedRate: 1, NoRetryAfter: true})
	a := b.send(t, msg("k", "a", "acct", 1))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Empty(t, a.retryAfter)
}
