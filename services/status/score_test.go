package status

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestScoreBookWindow: counts stay for an hour and then leave the window;
// a duplicate (not applied) counts only as a rate-limited attempt; waits
// are not attempts.
func TestScoreBookWindow(t *testing.T) {
	t.Parallel()
	b := newScoreBook()
	t0 := time.Date(2026, 12, 2, 8, 0, 30, 0, time.UTC)
	b.note(&contract.Event{Account: "a", Kind: contract.EventSent}, true, t0)
	b.note(&contract.Event{Account: "a", Kind: contract.EventSent}, false, t0) // duplicate
	b.note(&contract.Event{Account: "a", Kind: contract.EventRetrying, Class: contract.ClassRateLimited}, false, t0.Add(10*time.Minute))
	b.note(&contract.Event{Account: "a", Kind: contract.EventRetrying, Code: "daily_cap"}, true, t0.Add(10*time.Minute))
	b.note(&contract.Event{Account: "a", Kind: contract.EventUndelivered, Code: "131050"}, true, t0.Add(30*time.Minute))
	b.note(&contract.Event{Account: "", Kind: contract.EventSent}, true, t0)

	w := b.takeDirty(t0.Add(40*time.Minute), false)["a"]
	require.Equal(t, scoreCounts{sent: 1, undelivered: 1, blocked: 1, rateLimited: 1, attempts: 2}, scoreCounts{
		sent: w.sent, undelivered: w.undelivered, blocked: w.blocked, rateLimited: w.rateLimited, attempts: w.attempts})
	require.Empty(t, b.takeDirty(t0.Add(41*time.Minute), false), "nothing changed since")

	later := b.takeDirty(t0.Add(65*time.Minute), true)["a"]
	require.Zero(t, later.sent, "the send left the window")
	require.Equal(t, 1, later.rateLimited)
	require.Equal(t, 1, later.undelivered)
	gone := b.takeDirty(t0.Add(3*time.Hour), true)["a"]
	require.Equal(t, scoreCounts{}, scoreCounts{sent: gone.sent, undelivered: gone.undelivered, attempts: gone.attempts})
	require.Equal(t, 100, scoreOf(gone, contract.QualityGreen, t0).Score)
}
