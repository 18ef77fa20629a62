package scenario

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateAllowsForMeasuredStalls: requests stamped together at the end
// of a stall of the fakes' process are allowed rate*stall over the limit,
// no more, and only in a window that starts as the stall ends.
func TestRateAllowsForMeasuredStalls(t *testing.T) {
	t.Parallel()
	start := time.Now()
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	// 100/s for three seconds, but the ten requests that came during a
	// 100 ms stall ending at 1.5 s are stamped at its end.
	var ts []time.Time
	for i := range 300 {
		s := float64(i) / 100
		if s >= 1.4 && s < 1.5 {
			s = 1.5
		}
		ts = append(ts, at(s))
	}
	slices.SortFunc(ts, time.Time.Compare)
	const limit = 100 + 2 + 1

	w, over := overRate(ts, nil, 100, limit)
	require.True(t, over, "without a measured stall the bunch is over the limit")
	require.Equal(t, 110, w.n)
	require.Equal(t, at(1.5), w.at)
	require.Equal(t, "15 in its first 50 ms, 5 in its last; first gaps (ms) 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0 0.0",
		edges(ts, w.at), "the bunch at the window's start shows")

	stall := []Stall{{From: at(1.4), To: at(1.5)}}
	_, over = overRate(ts, stall, 100, limit)
	require.False(t, over, "a 100 ms stall allows 10 more at 100/s")

	short := []Stall{{From: at(1.48), To: at(1.5)}}
	w, over = overRate(ts, short, 100, limit)
	require.True(t, over, "a 20 ms stall allows only 2 more")
	require.Equal(t, 2, w.allowed)

	long := []Stall{{From: at(1.2), To: at(1.45)}}
	_, over = overRate(ts, long, 100, limit)
	require.True(t, over, "a stall that ended 50 ms before the window allows nothing")
}

func TestStallBefore(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ms := func(n int) time.Time { return start.Add(time.Duration(n) * time.Millisecond) }
	stalls := []Stall{{From: ms(100), To: ms(130)}, {From: ms(200), To: ms(205)}, {From: ms(300), To: ms(380)}}
	require.Equal(t, time.Duration(0), stallBefore(stalls, ms(100)), "a stall that begins at t held nothing back past it")
	require.Equal(t, 30*time.Millisecond, stallBefore(stalls, ms(131)))
	require.Equal(t, 30*time.Millisecond, stallBefore(stalls, ms(140)), "stallSettle after its end")
	require.Equal(t, time.Duration(0), stallBefore(stalls, ms(141)))
	require.Equal(t, 80*time.Millisecond, stallBefore(stalls, ms(350)), "within a stall")
}

// TestStallProbeNotesLateWakes: a wake stallMin later than the tick is a
// stall from the previous wake; one on time is not; and the probe itself
// starts and stops.
func TestStallProbeNotesLateWakes(t *testing.T) {
	t.Parallel()
	p := startStallProbe()
	time.Sleep(10 * time.Millisecond)
	p.Stop()
	p.Stop() // twice is fine
	p.stalls = nil
	start := time.Now()
	last := p.wake(start, start.Add(stallTick+time.Millisecond))
	last = p.wake(last, last.Add(stallTick+stallMin+time.Millisecond))
	require.Equal(t, []Stall{{From: start.Add(stallTick + time.Millisecond), To: last}}, p.stalls)
}
