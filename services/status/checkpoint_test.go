package status

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
)

// abortingReader gives one chunk, then cancels the put's context and
// fails, so the put ends without waiting for anything.
type abortingReader struct {
	cancel context.CancelFunc
	reads  int
}

func (r *abortingReader) Read(p []byte) (int, error) {
	if r.reads++; r.reads == 1 {
		return copy(p, "outcomes"), nil
	}
	r.cancel()
	return 0, errors.New("aborted")
}

// TestCheckpointPutsLeaveNoGoroutine guards the leak the churn soak
// found in status (50 -> 60 goroutines over 6,000 tasks): every
// checkpoint write (ObjectStore.Put) makes a publisher of its own, whose
// reconnect watcher goroutine, in nats.go before v1.56.0, read its status
// channel only once it first ran; a put that cleaned the publisher up
// before then left it waiting on a nil channel for ever. In the soak,
// 10 of the 6,000 tasks' checkpoint writes lost that race. Here it is made
// certain: on one P, a put that aborts after its first chunk never
// yields before its cleanup, so each such put leaked one goroutine.
//
// Not parallel: it sets GOMAXPROCS for the whole test binary.
func TestCheckpointPutsLeaveNoGoroutine(t *testing.T) {
	ts := natstest.Start(t)
	obs, err := ts.JS.CreateObjectStore(context.Background(), jetstream.ObjectStoreConfig{Bucket: contract.BucketStatus})
	require.NoError(t, err)
	s := &Service{checkpoints: obs}
	// A saved checkpoint first, so each aborted put runs the same path as
	// a rewrite of a task's checkpoint.
	require.NoError(t, s.saveCheckpoint(context.Background(), newFold("t")))

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const puts = 20
	before := runtime.NumGoroutine()
	for range puts {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := obs.Put(ctx, jetstream.ObjectMeta{Name: "t"}, &abortingReader{cancel: cancel})
		require.Error(t, err)
	}
	// The puts' reply subscriptions end asynchronously; a leaked watcher
	// never does.
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); after > before+2 && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond)
	}
	require.LessOrEqual(t, after, before+2, "goroutines after %d aborted puts (%d before)", puts, before)

	f, err := s.loadCheckpoint(context.Background(), "t")
	require.NoError(t, err)
	require.NotNil(t, f, "an aborted put keeps the saved checkpoint")
}
