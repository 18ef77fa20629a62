package dispatch

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestDispatchChecksJobsQueuedBeforeItsConsumer: the lanes' consumers keep
// their state in memory, so a server restart loses them with every
// delivery count, and a job that was sent but not acknowledged comes back
// as a first delivery. A job queued before its consumer was created is
// therefore checked for a sent event before it is sent: half the jobs here
// have one (sent before the "restart") and must not be sent again.
func TestDispatchChecksJobsQueuedBeforeItsConsumer(t *testing.T) {
	js := topologytest.Start(t).JS
	const n, sentBefore = 10, 5
	queueJobs(t, js, "again", "acct", n)
	publishSentEvents(t, js, "again", indexesBelow(sentBefore)...)
	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	runService(t, js, Config{})
	require.Eventually(t, func() bool { return sentEvents(t, js, "again") >= n }, 20*time.Second, 50*time.Millisecond, "the other jobs are sent")
	time.Sleep(time.Second)
	require.EqualValues(t, n, sentEvents(t, js, "again"), "the jobs sent before are not sent again")
}

// TestTakeOverChecksJobsQueuedBeforeTheConsumer: a server restart lost the
// consumer that sent half of an account's queued jobs; a replica made it
// again, took a job and was killed. The replica that takes over finds a
// consumer with state, but the jobs it delivers for the first time were
// queued before that consumer was made and may have been sent by the one
// lost: each is checked for an earlier send (multi-process scenario seed
// 583131964 sent such jobs twice).
func TestTakeOverChecksJobsQueuedBeforeTheConsumer(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n, sentBefore = 10, 6
	queueJobs(t, js, "lost-consumer", "acct", n)
	publishSentEvents(t, js, "lost-consumer", indexesBelow(sentBefore)...)
	const account = `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`
	putAccounts(t, js, map[string]string{"acct": account})

	// The replica killed after the restart: it made the consumer again and
	// took the first job, never settled.
	killed, err := New(js, Config{})
	require.NoError(t, err)
	var a contract.Account
	require.NoError(t, json.Unmarshal([]byte(account), &a))
	a.Name = "acct"
	r := newAccountRunner(ctx, killed, &a, nil)
	cons, through := r.laneConsumer(ctx, &a, contract.PriorityNormal, nil, nil)
	require.NotNil(t, cons)
	require.EqualValues(t, n, through, "a consumer made anew checks the jobs queued before it")
	require.Equal(t, strconv.Itoa(n), cons.CachedInfo().Config.Metadata[recheckMark], "and says so on itself")
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	require.NoError(t, err)
	for range batch.Messages() {
	}
	require.NoError(t, batch.Error())
	r.cancel()

	svc := runService(t, js, Config{})
	require.Eventually(t, func() bool { return sentEvents(t, js, "lost-consumer") >= n }, 20*time.Second, 50*time.Millisecond, "the other jobs are sent")
	time.Sleep(time.Second + ackWait) // the job the killed replica took comes back
	require.EqualValues(t, n, sentEvents(t, js, "lost-consumer"), "the jobs sent before are not sent again")
	ol := openLaneState(svc, "acct", laneNormal)
	require.NotNil(t, ol)
	require.EqualValues(t, n, ol.recheckThrough, "the replica taking over reads the mark")
}
