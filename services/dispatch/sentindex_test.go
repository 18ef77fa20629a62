package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// publishSentEvents stores sent events for the given recipient indexes.
func publishSentEvents(t *testing.T, js jetstream.JetStream, taskID string, indexes ...int) {
	t.Helper()
	for _, i := range indexes {
		ev := &contract.Event{TaskID: taskID, JobID: contract.JobID(taskID, i, false), Kind: contract.EventSent, Index: i, Attempt: 1, At: time.Now()}
		f, err := shared.PublishEventAsync(js, ev)
		require.NoError(t, err)
		_ = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		t.Fatal("events not stored")
	}
}

// indexesBelow is 0, 1, ..., n-1.
func indexesBelow(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// apiCalls is how many JetStream API requests the server has answered.
func apiCalls(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	info, err := js.AccountInfo(context.Background())
	require.NoError(t, err)
	return info.API.Total
}

// TestDispatchSentIndex: the index answers from the task's stored sent
// events, sees events stored after an earlier read, and still does after
// its reader vanished on the server (a consumer lost with a node, or
// removed for inactivity). Reading 5,000 events, and then 2,000 more, takes
// a handful of API requests (5 and 2 here), not a new consumer and the old
// one's deletion per fetch (an ordered consumer: 15 and 6).
func TestDispatchSentIndex(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx := context.Background()
	const task = "idx-task"
	evens := make([]int, 0, 5000)
	for i := range 10000 {
		if i%2 == 0 {
			evens = append(evens, i)
		}
	}
	publishSentEvents(t, js, task, evens...)
	publishSentEvents(t, js, "other-task", 1, 3, 5)

	x := newSentIndex(js)
	job := func(i int) *contract.Job {
		return &contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i}
	}
	calls0 := apiCalls(t, js)
	for _, i := range []int{0, 1, 9998, 9999, 5000, 5001} {
		sent, err := x.sent(ctx, job(i))
		require.NoError(t, err)
		require.Equal(t, i%2 == 0, sent, "index %d", i)
	}
	firstRead := apiCalls(t, js) - calls0 - 1 // the AccountInfo itself
	t.Logf("first read of 5,000 sent events: %d API requests", firstRead)
	require.LessOrEqual(t, firstRead, uint64(8))

	odds := make([]int, 0, 2000)
	for i := 1; i < 4000; i += 2 {
		odds = append(odds, i)
	}
	publishSentEvents(t, js, task, odds...)
	calls0 = apiCalls(t, js)
	for _, i := range []int{1, 3999, 4001} {
		sent, err := x.sent(ctx, job(i))
		require.NoError(t, err)
		require.Equal(t, i < 4000, sent, "index %d after more events", i)
	}
	secondRead := apiCalls(t, js) - calls0 - 1
	t.Logf("reading 2,000 more: %d API requests", secondRead)
	require.LessOrEqual(t, secondRead, uint64(4))

	// The reader vanishes on the server: the next read starts a new one
	// where the last left off.
	events, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	lister := events.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Config.Durable == "" {
			require.NoError(t, js.DeleteConsumer(ctx, contract.StreamEvents, ci.Name))
		}
	}
	publishSentEvents(t, js, task, 4001, 4003)
	for _, i := range []int{4001, 4003, 4005, 2} {
		sent, err := x.sent(ctx, job(i))
		require.NoError(t, err, fmt.Sprint(i))
		require.Equal(t, i != 4005, sent, "index %d after the reader vanished", i)
	}
}

// TestDispatchSentIndexSharesReads: lookups of one task that queue behind
// a read share it rather than each reading again. A cancelled task's
// unparked jobs (all rechecked) are cancelled only as fast as their
// lookups answer: with one read (two API requests) each, in turn, 1,400
// of them took 15-30 s on a loaded machine. A sent event stored after a
// read is still seen by a lookup asked after it was stored.
func TestDispatchSentIndexSharesReads(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx := context.Background()
	const task = "shared-reads"
	sentIdx := make([]int, 0, 1000)
	for i := range 1000 {
		sentIdx = append(sentIdx, i)
	}
	publishSentEvents(t, js, task, sentIdx...)
	x := newSentIndex(js)
	job := func(i int) *contract.Job {
		return &contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i}
	}
	sent, err := x.sent(ctx, job(0))
	require.NoError(t, err)
	require.True(t, sent)

	const lookups = 400
	calls0 := apiCalls(t, js)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, lookups)
	for i := range lookups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if sent, err := x.sent(ctx, job(1000+i)); err != nil || sent {
				errs <- fmt.Errorf("index %d: sent %v, err %v", 1000+i, sent, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	used := apiCalls(t, js) - calls0 - 1
	t.Logf("%d concurrent lookups of unsent jobs: %d API requests", lookups, used)
	require.Less(t, used, uint64(lookups/4), "lookups waiting for the lock share a read")

	publishSentEvents(t, js, task, 1400)
	sent, err = x.sent(ctx, job(1400))
	require.NoError(t, err)
	require.True(t, sent, "an event stored before the lookup is seen")
}
