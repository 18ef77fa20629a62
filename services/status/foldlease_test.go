package status

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestNoProgressWriteAfterTheConnectionDroppedDuringACheckpoint: a
// checkpoint's write that outlasts the connection succeeds after the
// reconnect, when another replica that heard this one gone may hold the
// partition and have written newer progress. The progress write after it
// must not go out then: the lease is asked again. (dispatch's send had
// the same gap: TestNoSendAfterTheConnectionDroppedSinceTheGrant.)
func TestNoProgressWriteAfterTheConnectionDroppedDuringACheckpoint(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const task, n = "fenced", 20
	publishSent(ctx, t, js, task, 0, n)
	svc, err := New(js, Config{Logger: logtest.Logger()})
	require.NoError(t, err)
	sb := newStandby(ctx, t, js, task)
	var hooked atomic.Bool
	tookOver := make(chan struct{})
	testHookCheckpointSaved = func(taskID string) {
		if taskID != task || !hooked.CompareAndSwap(false, true) {
			return
		}
		defer close(tookOver)
		sb.takeOver(ctx, t, svc)
	}
	t.Cleanup(func() { testHookCheckpointSaved = nil })
	stopped := make(chan error, 1)
	runCtx, stop := context.WithCancel(context.Background())
	go func() { stopped <- svc.Run(runCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-stopped) })

	select {
	case <-tookOver:
	case <-ctx.Done():
		t.Fatal("no checkpoint was saved")
	}
	// The other replica holds the partition for 2 s (refreshing its
	// lease); its progress stands.
	sb.hold(ctx, t, n, "progress written by a replica that no longer held the partition")
}

// TestLateProgressWriteDoesNotReplaceTheNextHolders: a progress write
// checked against the lease can reach the server after the connection
// dropped and came back (it waited in the client's reconnect buffer),
// when the replica that took the partition over has written newer
// progress. The hook puts the drop, the take-over and the newer write
// between the last lease check and the write, the order the server sees
// then; the write must be refused, not replace the newer progress. As a
// Put it replaced it (sent 20 of 20 over the holder's 999 of 1,000).
func TestLateProgressWriteDoesNotReplaceTheNextHolders(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const task, n = "late", 20
	publishSent(ctx, t, js, task, 0, n/2)
	svc, err := New(js, Config{Logger: logtest.Logger()})
	require.NoError(t, err)
	sb := newStandby(ctx, t, js, task)
	var writes atomic.Int32
	tookOver := make(chan struct{})
	testHookProgressWrite = func(taskID string) {
		// The first write goes through (its revision is then known); the
		// second is the late one.
		if taskID != task || writes.Add(1) != 2 {
			return
		}
		defer close(tookOver)
		sb.takeOver(ctx, t, svc)
	}
	t.Cleanup(func() { testHookProgressWrite = nil })
	stopped := make(chan error, 1)
	runCtx, stop := context.WithCancel(context.Background())
	go func() { stopped <- svc.Run(runCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-stopped) })

	natstest.Eventually(t, 20*time.Second, func() bool { return writes.Load() >= 1 }, "the first progress write")
	publishSent(ctx, t, js, task, n/2, n)
	select {
	case <-tookOver:
	case <-ctx.Done():
		t.Fatal("no second progress write")
	}
	// Holding the partition again, svc writes over the other's progress
	// (its revision moved) with what it folded.
	sb.hold(ctx, t, n, "a late write replaced the next holder's progress")
}

// standby plays the replica that takes partition 0 of 1 over from svc
// while svc's connection drops, writing its own progress for task.
type standby struct {
	leases, progress jetstream.KeyValue
	task             string
	theirs           []byte
}

// newStandby returns the standby of task, which writes sent 999 of 1,000.
func newStandby(ctx context.Context, t *testing.T, js jetstream.JetStream, task string) *standby {
	leases, err := js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	progress, err := js.KeyValue(ctx, contract.BucketProgress)
	require.NoError(t, err)
	theirs, err := json.Marshal(contract.Progress{TaskID: task, State: contract.StateProcessing, Total: 1000, Sent: 999})
	require.NoError(t, err)
	return &standby{leases: leases, progress: progress, task: task, theirs: theirs}
}

// publishSent stores the sent events of task's recipients from..to-1.
func publishSent(ctx context.Context, t *testing.T, js jetstream.JetStream, task string, from, to int) {
	for i := from; i < to; i++ {
		data, err := contract.EncodeEvent(&contract.Event{TaskID: task, JobID: fmt.Sprintf("%s.%d", task, i), To: "+15550000000",
			Account: "a", Kind: contract.EventSent, Index: i, Attempt: 1, At: time.Now().UTC()})
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.EventSubject(task, contract.EventSent), data)
		require.NoError(t, err)
	}
}

// takeOver drops svc's connection and waits for it to come back, then
// takes the partition's lease and writes its progress.
// (assert: it runs on svc's goroutine, not the test's.)
func (sb *standby) takeOver(ctx context.Context, t *testing.T, svc *Service) {
	conn := svc.js.Conn()
	before := conn.Stats().Reconnects
	assert.NoError(t, conn.ForceReconnect())
	assert.Eventually(t, func() bool { return conn.IsConnected() && conn.Stats().Reconnects > before }, 10*time.Second, 5*time.Millisecond)
	_, err := sb.leases.Put(ctx, FoldLeaseKey(0, 1), []byte("standby"))
	assert.NoError(t, err)
	_, err = sb.progress.Put(ctx, sb.task, sb.theirs)
	assert.NoError(t, err)
}

// hold keeps the lease for 2 s, checking each half second that its
// progress stands (why names what replaced it), then lets go and waits
// for svc, holding the partition again, to write the n sent it folded.
func (sb *standby) hold(ctx context.Context, t *testing.T, n int, why string) {
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		e, err := sb.progress.Get(ctx, sb.task)
		require.NoError(t, err)
		require.JSONEq(t, string(sb.theirs), string(e.Value()), why)
		_, err = sb.leases.Put(ctx, FoldLeaseKey(0, 1), []byte("standby"))
		require.NoError(t, err)
	}
	require.NoError(t, sb.leases.Delete(ctx, FoldLeaseKey(0, 1)))
	natstest.Eventually(t, 20*time.Second, func() bool {
		e, err := sb.progress.Get(ctx, sb.task)
		if err != nil {
			return false
		}
		var p contract.Progress
		return json.Unmarshal(e.Value(), &p) == nil && p.Sent == n
	}, "the partition's next holder writes the folded progress")
}
