package scenario

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestRateLeavesOutRequestsDelayedInTransport: ten requests begun during
// [1.4 s, 1.5 s) at 100/s but all arriving at 1.5 s put the second from
// 1.5 s over the limit when their starts are unknown, and not when they
// are known to have begun before it; a sender that begins too many within
// a second is over either way.
func TestRateLeavesOutRequestsDelayedInTransport(t *testing.T) {
	t.Parallel()
	start := time.Now()
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	const limit = 100 + 2 + 1
	var known, unknown []request
	for i := range 300 {
		began := at(float64(i) / 100)
		arrived := began
		if i >= 140 && i < 150 {
			arrived = at(1.5)
		}
		known = append(known, request{at: arrived, started: began})
		unknown = append(unknown, request{at: arrived})
	}
	sortRequests(known)
	sortRequests(unknown)

	w, over := overRate(unknown, limit)
	require.True(t, over, "with no starts the bunch is over the limit")
	require.Equal(t, rateWindow{at: at(1.5), n: 110}, w)
	require.Equal(t, "15 in its first 50 ms, 5 in its last; first gaps (ms) 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0",
		edges(unknown, w.at), "the bunch at the window's start shows")

	_, over = overRate(known, limit)
	require.False(t, over, "the ten begun before 1.5 s are left out of its second")

	// 115 begun within one second, arriving 5 ms later each: none early.
	var fast []request
	for i := range 115 {
		began := at(float64(i) / 115)
		fast = append(fast, request{at: began.Add(5 * time.Millisecond), started: began})
	}
	w, over = overRate(fast, limit)
	require.True(t, over)
	require.Equal(t, 115, w.n)
	require.Zero(t, w.early)
}

// TestCallStartsPairsHitsWithOutcomes: a recipient's hits and the
// call_started_at of its outcomes pair in order; a recipient with an
// outcome missing (a kill during the call) or one begun after it arrived
// gives no start.
func TestCallStartsPairsHitsWithOutcomes(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ms := func(n int) time.Time { return start.Add(time.Duration(n) * time.Millisecond) }
	ev := func(to string, began int) contract.Event {
		return contract.Event{TaskID: "t", JobID: "t." + to, To: to, Account: "a", Kind: contract.EventRetrying, CallStartedAt: ms(began)}
	}
	o := &Observation{Start: start,
		Events: map[string][]contract.Event{"t": {
			ev("r1", 10), ev("r1", 500), ev("r1", 500), // the second told twice
			ev("r2", 20),
			ev("r3", 40),
		}},
		Hits: map[string][]Hit{"a": {
			{At: ms(12), Call: 1, Task: "t", To: "r1"},
			{At: ms(25), Call: 2, Task: "t", To: "r2"},
			{At: ms(30), Call: 3, Task: "t", To: "r3"}, // begun at 40 ms: not this one
			{At: ms(31), Call: 4, Task: "t", To: "r4"}, // no outcome at all
			{At: ms(503), Call: 5, Task: "t", To: "r1"},
			{At: ms(600), Call: 6, Task: "t", To: "r2"}, // the kill: r2 has one outcome for two hits
		}},
	}
	c := &checker{o: o}
	require.Equal(t, map[int]time.Time{1: ms(10), 5: ms(500)}, c.callStarts("a"))
}
