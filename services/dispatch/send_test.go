package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestMayFollowLostAnswer: a redelivered job is marked maybe_sent unless
// its own previous delivery left an outcome. The attempt number cannot
// tell: it repeats after a move that spent no attempt (an account problem
// is recorded, then the job moves on at the same attempt), and copies of
// one job share the ledger entry; judged by it, a send in flight when its
// process died could be forgotten. The scenario tester found a recipient
// the provider had reached counted expired with no maybe_sent after a
// kill -9 of dispatch (seed 502688736).
func TestMayFollowLostAnswer(t *testing.T) {
	t.Parallel()
	failed := func(attempt int, seq, n uint64) *ledgerEntry {
		le := &ledgerEntry{}
		le.addAttempt(contract.AttemptError{Attempt: attempt, Class: contract.ClassRetryable, Code: "500"}, seq, n, false)
		return le
	}
	failedMaybeSent := func(attempt int, seq, n uint64) *ledgerEntry {
		le := &ledgerEntry{}
		le.addAttempt(contract.AttemptError{Attempt: attempt, Class: contract.ClassRetryable, Code: "500"}, seq, n, true)
		return le
	}
	cases := []struct {
		name string
		d    delivery
		want bool
	}{
		{"first delivery", delivery{seq: 7, delivered: 1, entry: &ledgerEntry{}}, false},
		{"redelivered after a recorded failure", delivery{seq: 7, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 7, 1)}, false},
		{"redelivered after a send in flight", delivery{seq: 7, delivered: 3, redelivered: true, attempt: 3, entry: failed(1, 7, 1)}, true},
		{"redelivered with nothing recorded", delivery{seq: 7, delivered: 2, redelivered: true, attempt: 2, entry: &ledgerEntry{}}, true},
		// The account problem was recorded at attempt 1 by message 5; the
		// moved job, message 9, sent attempt 1 again and its process died.
		{"moved at the same attempt", delivery{seq: 9, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 5, 1)}, true},
		{"another copy recorded last", delivery{seq: 9, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 8, 1)}, true},
		{"queued before its consumer lost its state", delivery{seq: 7, delivered: 1, recheck: true, attempt: 2, entry: failed(1, 7, 1)}, true},
		// Delivery 1 died during its send; delivery 2 knew, and recorded its
		// own failure: delivery 3 finds delivery 2 settled.
		{"redelivered after a recorded failure that followed a lost answer", delivery{seq: 7, delivered: 3, redelivered: true, attempt: 3, entry: failedMaybeSent(2, 7, 2)}, true},
	}
	for _, c := range cases {
		require.Equal(t, c.want, c.d.mayFollowLostAnswer(), c.name)
	}
}

// TestDispatchSaysMaybeSentAfterALostAnswer: a job whose first delivery
// was taken by a process that died during its send (here: fetched and
// never acknowledged) comes back, and every later outcome says maybe_sent:
// the retrying event of its next failed send (it was built as a sent event,
// which never says so), and the failed event of the delivery after that,
// which the ledger alone judged settled (seed 502688736: the provider's
// accepted call was followed by "retrying #2" and "expired #2" without it).
func TestDispatchSaysMaybeSentAfterALostAnswer(t *testing.T) {
	js := topologytest.Start(t).JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const task = "lost"
	queueJobs(t, js, task, "acct", 1)
	acct := `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4,"fail_rate":1}`
	putAccounts(t, js, map[string]string{"acct": acct})

	// Delivery 1: taken by the lane's consumer, never settled.
	var a contract.Account
	require.NoError(t, json.Unmarshal([]byte(acct), &a))
	a.Name = "acct"
	cons, err := js.CreateOrUpdateConsumer(ctx, contract.StreamJobs, consumerConfig(&a, contract.PriorityNormal))
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	taken := 0
	for range batch.Messages() {
		taken++
	}
	require.Equal(t, 1, taken)

	// Deliveries 2 and 3 answer 503; MaxAttempts 3 gives up after the second.
	runService(t, js, Config{BackoffBase: 50 * time.Millisecond})
	var evs []contract.Event
	require.Eventually(t, func() bool {
		evs = taskEvents(t, js, task)
		return slices.ContainsFunc(evs, func(e contract.Event) bool { return e.Kind == contract.EventFailed })
	}, 20*time.Second, 100*time.Millisecond, "the job is given up on")
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s #%d maybe_sent=%t", e.Kind, e.Attempt, e.MaybeSent))
	}
	require.Equal(t, []string{"retrying #2 maybe_sent=true", "failed #3 maybe_sent=true"}, got)
}

// taskEvents reads every stored event of task.
func taskEvents(t *testing.T, js jetstream.JetStream, task string) []contract.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.SubjectEventsPrefix + task + ".>"}})
	require.NoError(t, err)
	var evs []contract.Event
	for {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			var e contract.Event
			require.NoError(t, json.Unmarshal(m.Data(), &e))
			evs = append(evs, e)
		}
		if n == 0 {
			return evs
		}
	}
}

// TestRetryingEventsAfterAMoveAreKept: a move spends no attempt, so the
// moved job's first failure is "retrying #1" again, as was the account
// problem that moved it; both are true outcomes, and the second was dropped
// by EVENTS's duplicate window (same Nats-Msg-Id, job:retrying:1).
func TestRetryingEventsAfterAMoveAreKept(t *testing.T) {
	js := topologytest.Start(t).JS
	const task = "movedretry"
	putAccounts(t, js, map[string]string{
		"a": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4,"fatal_prefix":"user"}`,
		"b": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4,"fail_rate":1}`,
	})
	queueJobs(t, js, task, "a", 1)
	runService(t, js, Config{BackoffBase: 50 * time.Millisecond})
	var evs []contract.Event
	require.Eventually(t, func() bool {
		evs = taskEvents(t, js, task)
		return slices.ContainsFunc(evs, func(e contract.Event) bool { return e.Kind == contract.EventFailed })
	}, 20*time.Second, 100*time.Millisecond, "the job is given up on")
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s #%d %s %s", e.Kind, e.Attempt, e.Account, e.Code))
	}
	require.Equal(t, []string{"retrying #1 a 401", "retrying #1 b 503", "retrying #2 b 503", "failed #3 b 503"}, got)
}
