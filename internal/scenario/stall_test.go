package scenario

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
