package status

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// reconcileFixture stores progress for n tasks, as a process that takes
// over a partition finds them after a month of tasks: behind of them
// unfinished with a checkpoint ahead (sent 5 against the stored 3), as
// many unfinished and up to date, the rest finished.
func reconcileFixture(tb testing.TB, n, behind int) *Service {
	tb.Helper()
	ts := topologytest.Start(tb)
	ctx := context.Background()
	progress, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
	require.NoError(tb, err)
	checkpoints, err := ts.JS.ObjectStore(ctx, contract.BucketStatus)
	require.NoError(tb, err)
	s := &Service{js: ts.JS, progress: progress, checkpoints: checkpoints, log: logtest.Logger()}
	for i := range n {
		id := fmt.Sprintf("task-%06d", i)
		p := contract.Progress{TaskID: id, State: contract.StateSucceeded, Total: 10, Sent: 10, UpdatedAt: time.Now()}
		if i < 2*behind {
			p.State, p.Sent = contract.StateProcessing, 3
			f := newFold(id)
			f.P = p
			if i < behind {
				f.P.Sent = 5
			}
			require.NoError(tb, s.saveCheckpoint(ctx, f))
		}
		data, err := json.Marshal(p)
		require.NoError(tb, err)
		_, err = progress.Put(ctx, id, data)
		require.NoError(tb, err)
	}
	return s
}

// TestReconcileMarksOnlyTasksBehind checks that reconcile marks dirty, in
// each partition, exactly its unfinished tasks whose checkpoint is ahead:
// not the finished ones, not those up to date.
func TestReconcileMarksOnlyTasksBehind(t *testing.T) {
	t.Parallel()
	s := reconcileFixture(t, 300, 20)
	parts := newPartitions(4)
	marked := 0
	for _, p := range parts {
		require.NoError(t, s.reconcile(t.Context(), p))
		for id, f := range p.folds {
			require.True(t, p.owns(id), "partition %d marked %s, another partition's task", p.k, id)
			require.True(t, f.dirty, "%s in partition %d's folds but not dirty", id, p.k)
			require.Equal(t, 5, f.P.Sent, "%s: the checkpoint's state", id)
			marked++
		}
	}
	require.Equal(t, 20, marked, "tasks marked dirty over the 4 partitions")
}

// BenchmarkReconcile is one partition's check after its fold was taken
// over (of 1 and of 4), among 20,000 finished tasks and 20 behind.
func BenchmarkReconcile(b *testing.B) {
	s := reconcileFixture(b, 20_000, 20)
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			for b.Loop() {
				p := newPartitions(n)[0]
				require.NoError(b, s.reconcile(b.Context(), p))
			}
		})
	}
}
