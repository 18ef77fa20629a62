package shared_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// TestFollowWatch: FollowWatch returns only after the values present at the
// start were applied (marked initial), applies later changes in order
// (not initial), survives a panic in apply (logged with its stack, the
// entry skipped), and stops applying once ctx ends.
func TestFollowWatch(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv, err := ts.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FOLLOW"})
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c"} {
		_, err := kv.Put(ctx, k, []byte("1"))
		require.NoError(t, err)
	}

	var mu sync.Mutex
	var seen []string
	wctx, stop := context.WithCancel(ctx)
	w, err := kv.WatchAll(wctx)
	require.NoError(t, err)
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	require.NoError(t, shared.FollowWatch(wctx, w, log, func(e jetstream.KeyValueEntry, initial bool) {
		if string(e.Value()) == "panic" {
			panic("apply exploded")
		}
		mu.Lock()
		defer mu.Unlock()
		tag := "later:"
		if initial {
			tag = "initial:"
		}
		seen = append(seen, tag+e.Key())
	}))
	mu.Lock()
	require.Equal(t, []string{"initial:a", "initial:b", "initial:c"}, seen, "returned before the initial values were applied")
	mu.Unlock()

	_, err = kv.Put(ctx, "x", []byte("panic"))
	require.NoError(t, err)
	_, err = kv.Put(ctx, "b", []byte("2"))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "a"))
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 5
	}, "later changes applied")
	mu.Lock()
	require.Equal(t, []string{"later:b", "later:a"}, seen[3:])
	mu.Unlock()
	logMu.Lock()
	require.Contains(t, logs.String(), "PANIC recovered: applying FOLLOW key x")
	require.Contains(t, logs.String(), "apply exploded")
	logMu.Unlock()

	stop()
	time.Sleep(100 * time.Millisecond)
	_, err = kv.Put(ctx, "d", []byte("1"))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	require.Len(t, seen, 5, "nothing applied after ctx ended")
	mu.Unlock()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
