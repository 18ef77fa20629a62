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
// over a partition finds them after a month of tasks, most finished with a
// checkpoint saved before their progress. The first behind of them lost
// their last progress write, their checkpoint saved after it (sent 5
// against the stored 3); as many unfinished are up to date. Among those
// behind, every fourth was finished and reopened by retry-dead (stored
// finished with 9 sent and 1 failed, checkpoint unfinished with 9 sent and
// 1 retrying: its counts went down), and every fourth, offset by one, has
// no progress stored at all.
func reconcileFixture(tb testing.TB, n, behind int) *Service {
	tb.Helper()
	ts := topologytest.Start(tb)
	ctx := context.Background()
	progress, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
	require.NoError(tb, err)
	checkpoints, err := ts.JS.ObjectStore(ctx, contract.BucketStatus)
	require.NoError(tb, err)
	s := &Service{js: ts.JS, progress: progress, checkpoints: checkpoints, log: logtest.Logger()}
	put := func(p contract.Progress) {
		data, err := json.Marshal(p)
		require.NoError(tb, err)
		_, err = progress.Put(ctx, p.TaskID, data)
		require.NoError(tb, err)
	}
	for i := range n {
		id := fmt.Sprintf("task-%06d", i)
		p := contract.Progress{TaskID: id, State: contract.StateSucceeded, Total: 10, Sent: 10, UpdatedAt: time.Now()}
		f := newFold(id)
		f.P = p
		switch {
		case i < behind && i%4 == 0:
			p.State, p.Sent, p.Failed = contract.StatePartial, 9, 1
			f.P.State, f.P.Sent, f.P.Retrying = contract.StateProcessing, 9, 1
			put(p)
			require.NoError(tb, s.saveCheckpoint(ctx, f))
		case i < behind && i%4 == 1:
			require.NoError(tb, s.saveCheckpoint(ctx, f))
		case i < behind:
			p.State, p.Sent = contract.StateProcessing, 3
			f.P.State, f.P.Sent = contract.StateProcessing, 5
			put(p)
			require.NoError(tb, s.saveCheckpoint(ctx, f))
		case i < 2*behind:
			p.State, p.Sent = contract.StateProcessing, 3
			f.P = p
			require.NoError(tb, s.saveCheckpoint(ctx, f))
			put(p)
		default:
			require.NoError(tb, s.saveCheckpoint(ctx, f))
			put(p)
		}
	}
	return s
}

// TestReconcileMarksOnlyTasksBehind checks that reconcile marks dirty, in
// each partition, exactly the tasks whose last progress write was lost,
// finished and reopened ones and those without progress included, from
// their checkpoint's state: not the finished ones, not those up to date.
func TestReconcileMarksOnlyTasksBehind(t *testing.T) {
	t.Parallel()
	const behind = 20
	s := reconcileFixture(t, 300, behind)
	parts := newPartitions(4)
	marked := 0
	for _, p := range parts {
		require.NoError(t, s.reconcile(t.Context(), p))
		for id, f := range p.folds {
			require.True(t, p.owns(id), "partition %d marked %s, another partition's task", p.k, id)
			require.True(t, f.dirty, "%s in partition %d's folds but not dirty", id, p.k)
			var i int
			_, err := fmt.Sscanf(id, "task-%06d", &i)
			require.NoError(t, err)
			require.Less(t, i, behind, "%s marked, but its progress is up to date", id)
			want := contract.Progress{State: contract.StateProcessing, Sent: 5}
			switch i % 4 {
			case 0:
				want.Sent, want.Retrying = 9, 1
			case 1:
				want.State, want.Sent = contract.StateSucceeded, 10
			}
			require.Equal(t, want.State, f.P.State, "%s: the checkpoint's state", id)
			require.Equal(t, want.Sent, f.P.Sent, "%s: the checkpoint's sent", id)
			require.Equal(t, want.Retrying, f.P.Retrying, "%s: the checkpoint's retrying", id)
			marked++
		}
	}
	require.Equal(t, behind, marked, "tasks marked dirty over the 4 partitions")
}

// BenchmarkReconcile is one partition's check after its fold was taken
// over (of 1 and of 4), among 20,000 tasks, 20 of them behind.
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
