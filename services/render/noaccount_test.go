package render

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitLogOncePerInterval: every batch of a waiting task asks again
// after NoAccountRetry; the warning is logged once per task and interval,
// and again at once when the reason changes.
func TestWaitLogOncePerInterval(t *testing.T) {
	t.Parallel()
	var w waitLog
	t0 := time.Now()
	logged := 0
	for i := range 1000 { // 1,000 batches over 10 s
		if w.due("t1", "no enabled account among a", t0.Add(time.Duration(i)*10*time.Millisecond)) {
			logged++
		}
	}
	require.Equal(t, 1, logged)
	require.True(t, w.due("t2", "no enabled account among a", t0), "another task logs its own")
	require.True(t, w.due("t1", "no enabled account among a, b", t0.Add(11*time.Second)), "a new reason logs at once")
	require.False(t, w.due("t1", "no enabled account among a, b", t0.Add(12*time.Second)))
	require.True(t, w.due("t1", "no enabled account among a, b", t0.Add(11*time.Second+waitLogInterval)), "and again after the interval")
}
