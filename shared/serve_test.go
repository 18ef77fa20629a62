package shared

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestConcurrentHandlerBoundsAndOverlaps: a slow message does not hold up
// the next, at most limit run at once, and Wait waits for all.
func TestConcurrentHandlerBoundsAndOverlaps(t *testing.T) {
	t.Parallel()
	c := NewConcurrentHandler(3)
	var running, peak atomic.Int32
	var done atomic.Int32
	slow := make(chan struct{})
	h := c.Wrap(func(m *nats.Msg) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if m.Subject == "slow" {
			<-slow
		} else {
			time.Sleep(10 * time.Millisecond)
		}
		running.Add(-1)
		done.Add(1)
	})
	start := time.Now()
	h(&nats.Msg{Subject: "slow"})
	for range 10 {
		h(&nats.Msg{Subject: "fast"})
	}
	// Ten quick ones finished past the slow one, two at a time.
	require.Eventually(t, func() bool { return done.Load() == 10 }, 2*time.Second, time.Millisecond)
	require.Less(t, time.Since(start), time.Second)
	close(slow)
	c.wg.Wait()
	require.EqualValues(t, 11, done.Load())
	require.EqualValues(t, 3, peak.Load(), "at most the limit at once")
}

// TestKeyedMutexSerializesPerKey: work on one key never overlaps; other
// keys run beside it; no lock is left behind.
func TestKeyedMutexSerializesPerKey(t *testing.T) {
	t.Parallel()
	var k KeyedMutex
	var inA atomic.Int32
	var overlapA, otherRan atomic.Bool
	var wg sync.WaitGroup
	unlockA := k.Lock("a")
	wg.Go(func() {
		unlock := k.Lock("b") // not blocked by a
		otherRan.Store(true)
		unlock()
	})
	for range 20 {
		wg.Go(func() {
			unlock := k.Lock("a")
			if inA.Add(1) > 1 {
				overlapA.Store(true)
			}
			time.Sleep(time.Millisecond)
			inA.Add(-1)
			unlock()
		})
	}
	require.Eventually(t, otherRan.Load, time.Second, time.Millisecond)
	unlockA()
	wg.Wait()
	require.False(t, overlapA.Load())
	require.Empty(t, k.locks)
}
