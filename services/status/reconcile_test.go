package status

import (
	"bytes"
	"compress/gzip"
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
// checkpoint saved with the progress stored (every tenth by an earlier
// version: no metadata, stored before the progress). The first behind of
// them lost their last progress write, their checkpoint a second newer
// (sent 5 against the stored 3); as many unfinished are up to date, their
// progress written alone a second after the checkpoint. Among those
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
	at := time.Now().UTC()
	for i := range n {
		id := fmt.Sprintf("task-%06d", i)
		p := contract.Progress{TaskID: id, State: contract.StateSucceeded, Total: 10, Sent: 10, UpdatedAt: at}
		f := newFold(id)
		f.P = p
		switch {
		case i < behind && i%4 == 0:
			p.State, p.Sent, p.Failed = contract.StatePartial, 9, 1
			f.P.State, f.P.Sent, f.P.Retrying = contract.StateProcessing, 9, 1
			f.P.UpdatedAt = at.Add(time.Second)
			require.NoError(tb, s.saveCheckpoint(ctx, f))
			put(p)
		case i < behind && i%4 == 1:
			require.NoError(tb, s.saveCheckpoint(ctx, f))
		case i < behind:
			p.State, p.Sent = contract.StateProcessing, 3
			f.P.State, f.P.Sent = contract.StateProcessing, 5
			f.P.UpdatedAt = at.Add(time.Second)
			require.NoError(tb, s.saveCheckpoint(ctx, f))
			put(p)
		case i < 2*behind:
			p.State, p.Sent = contract.StateProcessing, 3
			f.P = p
			require.NoError(tb, s.saveCheckpoint(ctx, f))
			p.UpdatedAt = at.Add(time.Second)
			put(p)
		case i%10 == 0:
			data, err := json.Marshal(f)
			require.NoError(tb, err)
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			_, err = zw.Write(data)
			require.NoError(tb, err)
			require.NoError(tb, zw.Close())
			_, err = checkpoints.PutBytes(ctx, id, gz.Bytes())
			require.NoError(tb, err)
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

// TestLostWrite checks the comparison of a checkpoint's description with
// a stored progress value: by the progress's updated_at when the
// checkpoint notes it, else by the server's times.
func TestLostWrite(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	later := t0.Add(time.Millisecond)
	for _, tc := range []struct {
		name string
		cp   checkpointMark
		w    progressMark
		lost bool
	}{
		{"written with its checkpoint", checkpointMark{progressAt: t0, saved: later}, progressMark{updatedAt: t0, written: t0}, false},
		{"written alone later", checkpointMark{progressAt: t0, saved: t0}, progressMark{updatedAt: later, written: later}, false},
		{"lost", checkpointMark{progressAt: later, saved: later}, progressMark{updatedAt: t0, written: later.Add(time.Hour)}, true},
		{"old checkpoint, stored before the progress", checkpointMark{saved: t0}, progressMark{updatedAt: t0, written: later}, false},
		{"old checkpoint, stored after the progress", checkpointMark{saved: later}, progressMark{updatedAt: later, written: t0}, true},
	} {
		require.Equal(t, tc.lost, tc.cp.lostWrite(tc.w), tc.name)
	}
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
