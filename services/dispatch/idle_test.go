package dispatch

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// kvHas reports whether key is in KV bucket.
func kvHas(t *testing.T, js jetstream.JetStream, bucket, key string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	require.NoError(t, err)
	_, err = kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

// leaseHeld reports whether account's lease is in KV broadcast_leases.
func leaseHeld(t *testing.T, js jetstream.JetStream, account string) bool {
	t.Helper()
	return kvHas(t, js, contract.BucketLeases, account)
}

// asleepMarked reports whether account's asleep mark is in KV
// broadcast_lanes.
func asleepMarked(t *testing.T, js jetstream.JetStream, account string) bool {
	t.Helper()
	return kvHas(t, js, contract.BucketLanes, account)
}

// testSessionIdle is the tests' Config.SessionIdle.
const testSessionIdle = 2 * time.Second

// sleepyAccount runs a service with one account and waits until its first
// session (which creates the normal lane's consumer) has idled out: no
// lease, the asleep mark left, and no consumer on JOBS (deleted) or the
// normal lane's (kept, with Config.KeptConsumers above zero).
func sleepyAccount(t *testing.T, keptConsumers int) (jetstream.JetStream, *Service, *accountRunner) {
	t.Helper()
	js := topologytest.Start(t).JS
	putAccounts(t, js, map[string]string{"sleepy": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`})
	svc := runService(t, js, Config{SessionIdle: testSessionIdle, KeptConsumers: keptConsumers})
	require.Eventually(t, func() bool { return laneExists(t, js, "sleepy", contract.PriorityNormal) }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") }, 3*testSessionIdle+5*time.Second, 50*time.Millisecond,
		"the idle session ends and releases the lease")
	require.Eventually(t, func() bool { return asleepMarked(t, js, "sleepy") }, 5*time.Second, 20*time.Millisecond, "the asleep mark left")
	if keptConsumers > 0 {
		require.True(t, laneExists(t, js, "sleepy", contract.PriorityNormal), "the normal lane's consumer kept")
		require.Equal(t, 1, consumersOnJobs(t, js), "only the normal lane's")
		require.EqualValues(t, 1, svc.keptConsumers.Load())
	} else {
		require.Eventually(t, func() bool { return !laneExists(t, js, "sleepy", contract.PriorityNormal) }, 5*time.Second, 20*time.Millisecond,
			"the normal lane's consumer deleted")
		require.Zero(t, consumersOnJobs(t, js), "no consumer of JOBS costs the server")
	}
	svc.mu.Lock()
	r := svc.runners["sleepy"]
	svc.mu.Unlock()
	require.True(t, r.asleep())
	require.Eventually(t, func() bool { return goroutinesIn("(*accountRunner).reportHealth") == 0 }, 2*time.Second, 20*time.Millisecond,
		"a sleeping account has no health ticker")
	return js, svc, r
}

// goroutinesIn is how many goroutines of the process have fn on their
// stacks.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn+"(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// consumersOnJobs is how many consumers JOBS has.
func consumersOnJobs(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	return st.CachedInfo().State.Consumers
}

// TestIdleAccountSleeps: an account without work holds no lease and no
// consumer once its first session has idled out. Jobs wake it: its session
// takes the asleep mark down, creates the consumer, sends each job once
// without checking for earlier sends (the mark says they were never
// delivered), and sleeps again.
func TestIdleAccountSleeps(t *testing.T) {
	js, svc, r := sleepyAccount(t, -1)

	const n = 30
	start := time.Now()
	queueJobs(t, js, "wake", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "wake") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	woke := time.Since(start)
	require.False(t, r.asleep(), "a session runs")
	require.True(t, leaseHeld(t, js, "sleepy"))
	require.False(t, asleepMarked(t, js, "sleepy"), "the mark is down while a consumer exists")
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.Zero(t, ol.recheckThrough, "jobs queued after the mark are fresh")
	t.Logf("a sleeping account sent %d jobs %s after they were queued", n, woke.Round(time.Millisecond))
	require.Less(t, woke, 3*time.Second, "the finder wakes it within a look or two")

	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") && r.asleep() }, 3*testSessionIdle+5*time.Second, 50*time.Millisecond,
		"asleep again after the work")
	require.Eventually(t, func() bool { return asleepMarked(t, js, "sleepy") && consumersOnJobs(t, js) == 0 }, 5*time.Second, 20*time.Millisecond,
		"no consumer again")
	require.EqualValues(t, n, sentEvents(t, js, "wake"), "each job sent once")
}

// TestAsleepWithoutMarkRechecks: a sleeping account whose mark is gone
// (deleted by hand, say) takes the jobs that wake it as possibly delivered:
// each is checked for an earlier send, and sent once.
func TestAsleepWithoutMarkRechecks(t *testing.T) {
	js, svc, r := sleepyAccount(t, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketLanes)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "sleepy"))

	const n = 10
	queueJobs(t, js, "unmarked", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "unmarked") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.False(t, r.asleep())
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.NotZero(t, ol.recheckThrough, "without the mark the queued jobs are checked")
	time.Sleep(300 * time.Millisecond)
	require.EqualValues(t, n, sentEvents(t, js, "unmarked"), "each job sent once")
}

// TestAsleepMarkBoundsFreshJobs: the jobs at or before the sequence the
// asleep mark names (what a server crash that lost acknowledgements
// brings back) are checked for an earlier send; only later ones are
// fresh.
func TestAsleepMarkBoundsFreshJobs(t *testing.T) {
	js, svc, _ := sleepyAccount(t, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	const n = 10
	through := st.CachedInfo().State.LastSeq + n
	kv, err := js.KeyValue(ctx, contract.BucketLanes)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "sleepy", []byte(strconv.FormatUint(through, 10)))
	require.NoError(t, err)

	queueJobs(t, js, "before-mark", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "before-mark") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.Equal(t, through, ol.recheckThrough, "the jobs up to the mark's sequence are checked")
	require.False(t, asleepMarked(t, js, "sleepy"), "the mark is down while a consumer exists")
	time.Sleep(300 * time.Millisecond)
	require.EqualValues(t, n, sentEvents(t, js, "before-mark"), "each job sent once")
}

// TestWakingAccountAsksLittle: a task wakes all its sleeping accounts at
// once, so each wake should cost the server little. The runner that put
// the account to sleep takes the free lease before it would watch it (a
// watch is a consumer the server makes and deletes), takes its asleep
// mark down by the revision it left (no read), and looks up no lane
// consumer: it deleted them before it slept.
func TestWakingAccountAsksLittle(t *testing.T) {
	js, svc, _ := sleepyAccount(t, -1)
	asked := countAPIRequests(t, js)

	const n = 5
	queueJobs(t, js, "woken", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "woken") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.NotNil(t, openLaneState(svc, "sleepy", laneNormal))

	leases, lanes := "KV_"+contract.BucketLeases, "KV_"+contract.BucketLanes
	created := 0
	for subj, count := range asked() {
		switch {
		case strings.HasPrefix(subj, "$JS.API.CONSUMER.CREATE."+leases+"."), strings.HasPrefix(subj, "$JS.API.CONSUMER.DELETE."+leases+"."):
			t.Errorf("%s asked %d times: the free lease is taken without a watch", subj, count)
		case strings.HasPrefix(subj, "$JS.API.CONSUMER.INFO."+contract.StreamJobs+"."):
			t.Errorf("%s asked %d times: the runner deleted its consumers when it slept", subj, count)
		case subj == "$JS.API.DIRECT.GET."+lanes, strings.HasPrefix(subj, "$JS.API.DIRECT.GET."+lanes+"."):
			t.Errorf("%s asked %d times: the runner knows the mark it left", subj, count)
		case strings.HasPrefix(subj, "$JS.API.CONSUMER.CREATE."+contract.StreamJobs+"."+contract.DispatchConsumer("sleepy", contract.PriorityNormal)):
			created += count
		}
	}
	require.Equal(t, 1, created, "the normal lane's consumer is made once")
}

// countAPIRequests counts the JetStream API requests made from now on, by
// subject; the function it returns reads the counts so far.
func countAPIRequests(t *testing.T, js jetstream.JetStream) func() map[string]int {
	t.Helper()
	var mu sync.Mutex
	asked := map[string]int{}
	sub, err := js.Conn().Subscribe("$JS.API.>", func(m *nats.Msg) {
		mu.Lock()
		asked[m.Subject]++
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, js.Conn().Flush())
	return func() map[string]int {
		require.NoError(t, js.Conn().Flush())
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(asked)
	}
}

// jobsConsumerRequests is how many of asked's requests make, look up,
// update or delete a consumer of JOBS.
func jobsConsumerRequests(asked map[string]int) int {
	n := 0
	for subj, count := range asked {
		for _, op := range []string{"CREATE", "DURABLE.CREATE", "INFO", "DELETE"} {
			if strings.HasPrefix(subj, "$JS.API.CONSUMER."+op+"."+contract.StreamJobs+".") {
				n += count
			}
		}
	}
	return n
}

// TestSleepingAccountKeepsItsConsumer: with room among the kept consumers
// (Config.KeptConsumers) a sleeping account keeps its normal lane's
// consumer. The jobs that wake it are sent once, as fresh, and it sleeps
// again with the consumer still there.
func TestSleepingAccountKeepsItsConsumer(t *testing.T) {
	js, svc, r := sleepyAccount(t, 1)

	const n = 30
	queueJobs(t, js, "wake", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "wake") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.False(t, r.asleep(), "a session runs")
	require.False(t, asleepMarked(t, js, "sleepy"), "the mark is down while the lane is consumed")
	require.Zero(t, svc.keptConsumers.Load(), "an awake account holds no place among the kept")
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.Zero(t, ol.recheckThrough, "jobs queued after the mark are fresh")

	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") && r.asleep() }, 3*testSessionIdle+5*time.Second, 50*time.Millisecond,
		"asleep again after the work")
	require.Eventually(t, func() bool { return asleepMarked(t, js, "sleepy") && svc.keptConsumers.Load() == 1 }, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, consumersOnJobs(t, js), "the consumer kept again")
	require.EqualValues(t, n, sentEvents(t, js, "wake"), "each job sent once")
}

// TestWakingKeptAccountAsksNoConsumer: the runner that kept its account's
// consumer wakes without making, looking up or updating any consumer of
// JOBS, and without reading its mark: taking the mark down by the revision
// it left proves nobody used the consumer since.
func TestWakingKeptAccountAsksNoConsumer(t *testing.T) {
	js, svc, _ := sleepyAccount(t, 1)
	asked := countAPIRequests(t, js)

	const n = 5
	queueJobs(t, js, "woken", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "woken") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.NotNil(t, openLaneState(svc, "sleepy", laneNormal))
	got := asked()
	require.Zero(t, jobsConsumerRequests(got), "no consumer of JOBS asked about: %v", got)
	for subj := range got {
		require.False(t, strings.HasPrefix(subj, "$JS.API.DIRECT.GET.KV_"+contract.BucketLanes), "%s: the runner knows the mark it left", subj)
		require.False(t, strings.HasPrefix(subj, "$JS.API.CONSUMER.CREATE.KV_"+contract.BucketLeases+"."), "%s: the free lease is taken without a watch", subj)
	}
	require.Positive(t, got["$JS.API.CONSUMER.MSG.NEXT."+contract.StreamJobs+"."+contract.DispatchConsumer("sleepy", contract.PriorityNormal)],
		"the kept consumer is pulled from")
}

// TestKeptConsumerAfterAnotherSession: when the asleep mark was taken down
// since the runner left it (another replica's session ran), the runner
// does not trust what it kept: it looks the consumer up like any session,
// and each job is sent once.
func TestKeptConsumerAfterAnotherSession(t *testing.T) {
	js, svc, _ := sleepyAccount(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketLanes)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "sleepy"))
	asked := countAPIRequests(t, js)

	const n = 10
	queueJobs(t, js, "other", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "other") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.NotNil(t, openLaneState(svc, "sleepy", laneNormal))
	require.Positive(t, jobsConsumerRequests(asked()), "the consumer is looked up")
	require.Zero(t, svc.keptConsumers.Load())
	time.Sleep(300 * time.Millisecond)
	require.EqualValues(t, n, sentEvents(t, js, "other"), "each job sent once")
}

// TestKeptConsumerLostIsMadeAgain: a kept consumer the server no longer
// has (its state is in memory: a restart loses it) ends the session that
// finds it gone; the next session makes it anew, checks the jobs queued
// before for earlier sends, and sends each once.
func TestKeptConsumerLostIsMadeAgain(t *testing.T) {
	js, svc, _ := sleepyAccount(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, js.DeleteConsumer(ctx, contract.StreamJobs, contract.DispatchConsumer("sleepy", contract.PriorityNormal)))

	const n = 10
	queueJobs(t, js, "lost", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "lost") >= n }, 15*time.Second, 10*time.Millisecond, "the jobs are sent")
	ol := openLaneState(svc, "sleepy", laneNormal)
	require.NotNil(t, ol)
	require.NotZero(t, ol.recheckThrough, "the consumer made anew checks the jobs queued before it")
	require.True(t, laneExists(t, js, "sleepy", contract.PriorityNormal))
	time.Sleep(300 * time.Millisecond)
	require.EqualValues(t, n, sentEvents(t, js, "lost"), "each job sent once")
}

// TestKeptConsumerFollowsAnEdit: an account whose concurrency changed
// while it slept gets its kept consumer updated when it wakes (the edit
// starts a new runner, which knows nothing kept), and the place among the
// kept consumers is given back meanwhile.
func TestKeptConsumerFollowsAnEdit(t *testing.T) {
	js, svc, _ := sleepyAccount(t, 1)
	putAccounts(t, js, map[string]string{"sleepy": `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":7}`})
	require.Eventually(t, func() bool { return svc.keptConsumers.Load() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the old runner gave its place back")

	const n = 5
	queueJobs(t, js, "edited", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "edited") >= n }, 10*time.Second, 10*time.Millisecond, "the jobs are sent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer("sleepy", contract.PriorityNormal))
	require.NoError(t, err)
	require.Equal(t, 7, c.CachedInfo().Config.MaxAckPending, "the consumer follows the new concurrency")
}

// TestKeptConsumersHaveABudget: beyond Config.KeptConsumers, sleeping
// accounts delete their normal lane's consumer.
func TestKeptConsumersHaveABudget(t *testing.T) {
	js := topologytest.Start(t).JS
	accounts := map[string]string{}
	for _, name := range []string{"a1", "a2", "a3"} {
		accounts[name] = `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`
	}
	putAccounts(t, js, accounts)
	svc := runService(t, js, Config{SessionIdle: testSessionIdle, KeptConsumers: 2})
	require.Eventually(t, func() bool {
		for name := range accounts {
			if leaseHeld(t, js, name) || !asleepMarked(t, js, name) {
				return false
			}
		}
		return consumersOnJobs(t, js) == 2
	}, 3*testSessionIdle+10*time.Second, 50*time.Millisecond, "all asleep, two consumers kept")
	require.EqualValues(t, 2, svc.keptConsumers.Load())
}

// TestSessionIdleFromEnv: DISPATCH_SESSION_IDLE sets Config.SessionIdle;
// a bad value names the variable, a negative one the field.
func TestSessionIdleFromEnv(t *testing.T) {
	t.Setenv("DISPATCH_SESSION_IDLE", "750ms")
	c, err := ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, 750*time.Millisecond, c.SessionIdle)
	t.Setenv("DISPATCH_SESSION_IDLE", "soon")
	_, err = ConfigFromEnv()
	require.EqualError(t, err, `DISPATCH_SESSION_IDLE: "soon" is not a duration like 1s`)
	t.Setenv("DISPATCH_SESSION_IDLE", "-1s")
	_, err = ConfigFromEnv()
	require.EqualError(t, err, "SessionIdle (DISPATCH_SESSION_IDLE): must not be negative")
	c = Config{}
	c.withDefaults()
	require.Equal(t, 10*time.Second, c.SessionIdle, "the default")
}

// TestKeptConsumersFromEnv: DISPATCH_KEPT_CONSUMERS sets
// Config.KeptConsumers, a negative count keeps none, and a bad value names
// the variable.
func TestKeptConsumersFromEnv(t *testing.T) {
	t.Setenv("DISPATCH_KEPT_CONSUMERS", "250")
	c, err := ConfigFromEnv()
	require.NoError(t, err)
	c.withDefaults()
	require.Equal(t, 250, c.KeptConsumers)
	t.Setenv("DISPATCH_KEPT_CONSUMERS", "-1")
	c, err = ConfigFromEnv()
	require.NoError(t, err)
	c.withDefaults()
	require.Equal(t, -1, c.KeptConsumers, "none kept")
	t.Setenv("DISPATCH_KEPT_CONSUMERS", "many")
	_, err = ConfigFromEnv()
	require.EqualError(t, err, `DISPATCH_KEPT_CONSUMERS: "many" is not a count like 1000 (-1 keeps none)`)
	c = Config{}
	c.withDefaults()
	require.Equal(t, 1000, c.KeptConsumers, "the default")
}

// TestWakeNoticeWakesAheadOfJobs: a wake notice naming a sleeping account
// starts its session before any of its jobs is stored (the lane finder
// waits for them); the jobs that follow are sent once, and with no more
// work the account sleeps again. Names of accounts it does not know
// change nothing.
func TestWakeNoticeWakesAheadOfJobs(t *testing.T) {
	js, svc, r := sleepyAccount(t, 1)
	start := time.Now()
	require.NoError(t, js.Conn().Publish(contract.SubjectWake, []byte("nobody\nsleepy")))
	require.Eventually(t, func() bool { return openLaneState(svc, "sleepy", laneNormal) != nil }, 2*time.Second, 5*time.Millisecond,
		"the notice starts a session, no job stored")
	woke := time.Since(start)
	require.True(t, leaseHeld(t, js, "sleepy"))
	require.False(t, asleepMarked(t, js, "sleepy"), "the mark is down while the lane is consumed")
	t.Logf("the session consumed its lane %s after the notice", woke.Round(time.Millisecond))

	const n = 5
	queueJobs(t, js, "announced", "sleepy", n)
	require.Eventually(t, func() bool { return sentEvents(t, js, "announced") >= n }, 5*time.Second, 10*time.Millisecond, "the jobs are sent")
	require.Eventually(t, func() bool { return !leaseHeld(t, js, "sleepy") && r.asleep() }, 3*testSessionIdle+5*time.Second, 50*time.Millisecond,
		"asleep again after the work")
	require.EqualValues(t, n, sentEvents(t, js, "announced"), "each job sent once")
}

// TestWakeNoticeWithoutJobsIdlesOut: a notice whose jobs never come costs
// one session, which idles out like any other.
func TestWakeNoticeWithoutJobsIdlesOut(t *testing.T) {
	js, svc, r := sleepyAccount(t, 1)
	require.NoError(t, js.Conn().Publish(contract.SubjectWake, []byte("sleepy")))
	require.Eventually(t, func() bool { return !r.asleep() }, 2*time.Second, 5*time.Millisecond, "the notice starts a session")
	require.Eventually(t, func() bool { return r.asleep() && !leaseHeld(t, js, "sleepy") && asleepMarked(t, js, "sleepy") },
		3*testSessionIdle+wakeNoticeFor+5*time.Second, 50*time.Millisecond, "asleep again")
	require.EqualValues(t, 1, svc.keptConsumers.Load(), "the consumer kept again")
}
