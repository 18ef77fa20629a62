package status

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestBreakerCountsABatchCallOnce checks that a failure a whole batch call
// got counts once (CallShared on all its events but one), while failures
// of single sends count each.
func TestBreakerCountsABatchCallOnce(t *testing.T) {
	t.Parallel()
	sent := &contract.Event{Kind: contract.EventSent}
	limited := func(callShared bool) *contract.Event {
		return &contract.Event{Kind: contract.EventRetrying, Class: contract.ClassRateLimited, CallShared: callShared}
	}

	var b breakerWindow
	b.reset(10)
	for range 8 {
		b.record(sent)
	}
	for i := range 6 {
		b.record(limited(i > 0))
	}
	_, trip := b.check(0.5)
	require.False(t, trip, "one rate-limited call of 6 is one failure")
	require.Equal(t, 1, b.fails)
	require.Equal(t, 9, b.filled)

	b.reset(10)
	for range 8 {
		b.record(sent)
	}
	for range 6 {
		b.record(limited(false))
	}
	_, trip = b.check(0.5)
	require.True(t, trip, "six single sends rate limited are six failures")
	require.Equal(t, 6, b.fails)
}

// TestBreakerIgnoresWaits: recipients waiting for capacity or for their
// quiet hours to end are no failures; a campaign started at night must not
// trip the breaker.
func TestBreakerIgnoresWaits(t *testing.T) {
	t.Parallel()
	var b breakerWindow
	b.reset(10)
	for _, code := range []string{"daily_cap", "no_healthy_account", contract.CodeQuietHours, contract.CodeQuietHours, contract.CodeQuietHours} {
		b.record(&contract.Event{Kind: contract.EventRetrying, Code: code})
	}
	b.record(&contract.Event{Kind: contract.EventRetrying, Code: "503", Class: contract.ClassRetryable})
	require.Equal(t, [2]int{1, 1}, [2]int{b.fails, b.filled}, "only the 503 counts")
}
