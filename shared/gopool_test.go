package shared

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGoPoolReusesGoroutines: functions run one after another share one
// goroutine; functions that overlap get one each; idle goroutines end
// after the idle time, and when the context ends.
func TestGoPoolReusesGoroutines(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := NewGoPool(ctx, 300*time.Millisecond)

	ids := map[uint64]bool{}
	for range 50 {
		done := make(chan uint64)
		p.Go(func() { done <- goid() })
		ids[<-done] = true
		require.Eventually(t, func() bool { return idlePoolGoroutines() == 1 }, 5*time.Second, 100*time.Microsecond, "the goroutine is back waiting")
	}
	require.Len(t, ids, 1, "run one after another, the functions shared a goroutine")

	var wg sync.WaitGroup
	var ran atomic.Int32
	release := make(chan struct{})
	for range 20 {
		wg.Add(1)
		p.Go(func() { defer wg.Done(); ran.Add(1); <-release })
	}
	require.Eventually(t, func() bool { return ran.Load() == 20 }, 5*time.Second, time.Millisecond, "overlapping functions run at once")
	require.Equal(t, 20, poolGoroutines())
	close(release)
	wg.Wait()
	require.Eventually(t, func() bool { return poolGoroutines() == 0 }, 5*time.Second, 10*time.Millisecond, "idle goroutines end")

	p = NewGoPool(ctx, time.Hour)
	release = make(chan struct{})
	for range 5 {
		wg.Add(1)
		p.Go(func() { defer wg.Done(); <-release })
	}
	require.Equal(t, 5, poolGoroutines())
	close(release)
	wg.Wait()
	cancel()
	require.Eventually(t, func() bool { return poolGoroutines() == 0 }, time.Second, time.Millisecond, "they end with the context")
}

// poolGoroutines counts the goroutines in GoPool.run (or not started yet:
// in the go statement's wrapper); idlePoolGoroutines those waiting for
// work in its select.
func poolGoroutines() int { return countPool(false) }

func idlePoolGoroutines() int { return countPool(true) }

func countPool(idle bool) int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
		pool := bytes.Contains(g, []byte("shared.(*GoPool).run(")) || bytes.Contains(g, []byte("shared.(*GoPool).Go.gowrap"))
		if pool && (!idle || bytes.Contains(g, []byte(" [select"))) {
			n++
		}
	}
	return n
}

// goid is the calling goroutine's id, from its stack trace's header.
func goid() uint64 {
	var buf [32]byte
	n := runtime.Stack(buf[:], false)
	var id uint64
	for _, c := range buf[len("goroutine "):n] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
