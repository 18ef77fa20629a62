package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// callLog is a sandbox channel whose senders note which jobs each call
// carried; jobs of task fail are answered with a retryable error.
type callLog struct {
	channels.Sandbox
	fail  string
	mu    sync.Mutex
	calls [][]string // job ids per call
	sent  map[string]int
}

func (c *callLog) NewSender(a *contract.Account, getenv func(string) string) (channels.Sender, error) {
	s, err := c.Sandbox.NewSender(a, getenv)
	if err != nil {
		return nil, err
	}
	return &callLogSender{Sender: s, log: c}, nil
}

type callLogSender struct {
	channels.Sender
	log *callLog
}

func (s *callLogSender) Send(ctx context.Context, msgs []channels.Message) []channels.Result {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	s.log.mu.Lock()
	s.log.calls = append(s.log.calls, ids)
	s.log.mu.Unlock()
	res := s.Sender.Send(ctx, msgs)
	s.log.mu.Lock()
	for i, r := range res {
		if msgs[i].TaskID == s.log.fail {
			r = channels.Result{Class: contract.ClassRetryable, Code: "503", Err: "unavailable"}
			res[i] = r
		}
		if r.OK() {
			s.log.sent[msgs[i].ID]++
		}
	}
	s.log.mu.Unlock()
	return res
}

func (c *callLog) snapshot() (calls [][]string, sent map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sent = map[string]int{}
	for id, n := range c.sent {
		sent[id] = n
	}
	return append([][]string(nil), c.calls...), sent
}

// lateProgress shortens the ack wait of account's normal lane on the
// server to wait, once the account's session has created it, while the
// consume loop still reports progress every second: every job handled for
// longer than wait is redelivered while its first delivery is still in its
// handler, as when progress reports arrive late on a loaded machine.
func lateProgress(t *testing.T, js jetstream.JetStream, account string, wait time.Duration) {
	t.Helper()
	ctx := t.Context()
	require.Eventually(t, func() bool {
		_, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, contract.PriorityNormal))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "the lane's consumer was never created")
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	e, err := kv.Get(ctx, account)
	require.NoError(t, err)
	var a contract.Account
	require.NoError(t, json.Unmarshal(e.Value(), &a))
	a.Name = account
	cfg := consumerConfig(&a, contract.PriorityNormal)
	cfg.AckWait = wait
	_, err = js.UpdateConsumer(ctx, contract.StreamJobs, cfg)
	require.NoError(t, err)
}

// TestRedeliveryWhileHandledSendsOnce plays a loaded machine on which the
// progress reports of a batch account's jobs come late (seed 5 of the
// scenario tester: ten WxPusher recipients accepted twice, in two calls 49
// ms apart). The server redelivers each job while its first delivery is
// still in the provider call; the redelivery finds no sent event yet and
// must not send again: the delivery in hand settles the message.
func TestRedeliveryWhileHandledSendsOnce(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	const n = 5
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":2,"max_batch":5,"latency":"1200ms"}`})
	log := &callLog{sent: map[string]int{}}
	runService(t, js, Config{Channels: channels.Registry{"sandbox": log}, BackoffBase: 50 * time.Millisecond})
	queueJobs(t, js, "live", "a", n)
	lateProgress(t, js, "a", 250*time.Millisecond)

	require.Eventually(t, func() bool { return sentEvents(t, js, "live") >= n && jobsLeft(t, js, "a") == 0 },
		20*time.Second, 20*time.Millisecond, "every job sent and acknowledged")
	time.Sleep(time.Second) // a second call would come within this
	calls, sent := log.snapshot()
	for id, k := range sent {
		require.Equal(t, 1, k, "job %s accepted %d times; calls: %v", id, k, calls)
	}
	require.Len(t, sent, n, "calls: %v", calls)
	require.EqualValues(t, n, sentEvents(t, js, "live"))
}

// TestDeliveriesLeftSpendNoAttempt: the deliveries left to the one in
// hand did nothing, so the retries after its failure count attempts 2 and
// 3 (not the delivery counts) and do not take the left deliveries for
// sends whose answers were lost (maybe_sent).
func TestDeliveriesLeftSpendNoAttempt(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	const task = "livefail"
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":2,"max_batch":5,"latency":"800ms"}`})
	log := &callLog{sent: map[string]int{}, fail: task}
	runService(t, js, Config{Channels: channels.Registry{"sandbox": log}, BackoffBase: 50 * time.Millisecond})
	// A job first, so the lane's consumer has delivered one and the next
	// is not checked as queued before it (delivery.recheck, maybe_sent).
	queueJobs(t, js, "warmup", "a", 1)
	require.Eventually(t, func() bool { return sentEvents(t, js, "warmup") == 1 && jobsLeft(t, js, "a") == 0 },
		10*time.Second, 20*time.Millisecond)
	lateProgress(t, js, "a", 250*time.Millisecond)
	queueJobs(t, js, task, "a", 1)

	var evs []contract.Event
	require.Eventually(t, func() bool {
		evs = taskEvents(t, js, task)
		return slices.ContainsFunc(evs, func(e contract.Event) bool { return e.Kind == contract.EventFailed })
	}, 20*time.Second, 100*time.Millisecond, "the job is given up on")
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s #%d maybe_sent=%v", e.Kind, e.Attempt, e.MaybeSent))
	}
	calls, _ := log.snapshot()
	calls = calls[1:] // the warm-up's
	require.Equal(t, []string{"retrying #1 maybe_sent=false", "retrying #2 maybe_sent=false", "failed #3 maybe_sent=false"}, got, "calls: %v", calls)
	require.Len(t, calls, 3, "one call per attempt")
}

// jobsLeft counts the jobs of account's normal lane still in JOBS.
func jobsLeft(t *testing.T, js jetstream.JetStream, account string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	subject := contract.JobSubject(account, contract.PriorityNormal)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// TestLeftDeliveriesNamedWhenLeftUnsent: deliveries of a message that came
// while an earlier one was in hand (its ack wait ran out on a loaded
// machine) are known only to this process. The delivery in hand, handing
// its job back unsent at a stop, names the last of them in the ledger, so
// the next delivery, in a new process that knows nothing of them, does not
// take the gap for a send whose answer was lost (the CI failure of
// TestJobsLeftAtAStopAreNotMaybeSent under -race: 8 of 8 maybe_sent); the
// next delivery in this process, counting them as left, agrees.
func TestLeftDeliveriesNamedWhenLeftUnsent(t *testing.T) {
	x := newLiveJobs()
	c := x.claim(7, 1)
	require.NotNil(t, c)
	require.Nil(t, x.claim(7, 2), "left to the delivery in hand")
	require.Nil(t, x.claim(7, 3))
	require.Equal(t, uint64(3), c.deliveredThrough())
	entry := &ledgerEntry{Seq: 7, Delivery: c.deliveredThrough()}
	c.settled(errors.New("handed back"))

	elsewhere := &delivery{seq: 7, delivered: 4, redelivered: true, entry: entry}
	require.False(t, elsewhere.mayFollowLostAnswer(), "a new process: the delivery before it is named")
	next := x.claim(7, 4)
	require.NotNil(t, next)
	here := &delivery{seq: 7, delivered: 4, redelivered: true, justLeft: 4 - 1 - next.prev, entry: entry}
	require.Equal(t, uint64(2), here.justLeft)
	require.False(t, here.mayFollowLostAnswer(), "this process: the deliveries left are known")

	ranOnly := &ledgerEntry{Seq: 7, Delivery: 1}
	require.True(t, (&delivery{seq: 7, delivered: 4, redelivered: true, entry: ranOnly}).mayFollowLostAnswer(),
		"a new process that finds only the first delivery recorded cannot tell the gap from a lost answer")
	require.False(t, (&delivery{seq: 7, delivered: 4, redelivered: true, justLeft: 2, entry: ranOnly}).mayFollowLostAnswer())
}
