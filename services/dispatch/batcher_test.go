package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/shared"
)

// fakeProvider records the calls a batcher makes.
type fakeProvider struct {
	mu       sync.Mutex
	calls    [][]channels.Message
	tokens   atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
	noted    atomic.Int64
	// block, when set, holds every call until it is closed.
	block chan struct{}
	// paused is the set of task ids admit refuses.
	paused sync.Map
}

func (f *fakeProvider) deps() batchDeps {
	return batchDeps{
		wait: func(ctx context.Context) error {
			f.tokens.Add(1)
			return ctx.Err()
		},
		admit: func(job *contract.Job) bool {
			_, p := f.paused.Load(job.TaskID)
			return !p
		},
		send: func(ctx context.Context, msgs []channels.Message) []channels.Result {
			n := f.inFlight.Add(1)
			for {
				m := f.maxIn.Load()
				if n <= m || f.maxIn.CompareAndSwap(m, n) {
					break
				}
			}
			defer f.inFlight.Add(-1)
			f.mu.Lock()
			f.calls = append(f.calls, append([]channels.Message(nil), msgs...))
			f.mu.Unlock()
			if f.block != nil {
				<-f.block
			}
			out := make([]channels.Result, len(msgs))
			for i, m := range msgs {
				out[i] = channels.Result{ProviderID: "p-" + m.ID}
				if strings.HasPrefix(m.To, "bad") {
					out[i] = channels.Result{Class: contract.ClassRetryable, Code: "1005", Err: "busy"}
				}
			}
			return out
		},
		called: func([]channels.Result, time.Duration) { f.noted.Add(1) },
	}
}

func (f *fakeProvider) snapshot() [][]channels.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]channels.Message(nil), f.calls...)
}

// startBatcher runs a batcher until the test ends.
func startBatcher(t *testing.T, f *fakeProvider, maxBatch, calls int, linger, maxWait time.Duration) *batcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := newBatcher(f.deps(), maxBatch, linger, maxWait)
	b.start(ctx, calls)
	return b
}

func testJob(task string, i int, to, body string) (*contract.Job, channels.Message) {
	job := &contract.Job{ID: fmt.Sprintf("%s.%d", task, i), TaskID: task, Index: i, To: to, Body: body}
	return job, channels.Message{ID: job.ID, TaskID: task, To: to, Body: body}
}

// submitSettle submits like a job handler: a sent job is settled at once.
func submitSettle(ctx context.Context, b *batcher, job *contract.Job, msg channels.Message) batchOutcome {
	o := b.submit(ctx, job, msg)
	if o.sent {
		b.settled()
	}
	return o
}

// submitAll submits every (to, body) from its own goroutine, as the consume
// loop's handlers do, and returns the outcomes by job id.
func submitAll(ctx context.Context, b *batcher, task string, tos, bodies []string) map[string]batchOutcome {
	var mu sync.Mutex
	out := map[string]batchOutcome{}
	var wg sync.WaitGroup
	for i := range tos {
		job, msg := testJob(task, i, tos[i], bodies[i])
		wg.Go(func() {
			o := submitSettle(ctx, b, job, msg)
			mu.Lock()
			out[job.ID] = o
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func TestBatcherGroupsIdenticalBodies(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	b := startBatcher(t, f, 4, 1, 300*time.Millisecond, time.Hour)
	// 9 of A, 3 of B, 1 of C, interleaved; "bad" recipients fail.
	var tos, bodies []string
	for i := range 13 {
		body := "A"
		switch {
		case i%4 == 1 && i < 12:
			body = "B"
		case i == 12:
			body = "C"
		}
		to := fmt.Sprint("u", i)
		if i == 4 || i == 5 {
			to = fmt.Sprint("bad", i)
		}
		tos, bodies = append(tos, to), append(bodies, body)
	}
	out := submitAll(context.Background(), b, "t", tos, bodies)

	calls := f.snapshot()
	perBody := map[string][]int{}
	seen := map[string]int{}
	for _, c := range calls {
		for _, m := range c {
			require.Equal(t, c[0].Body, m.Body, "one call carries one text")
			seen[m.ID]++
		}
		perBody[c[0].Body] = append(perBody[c[0].Body], len(c))
	}
	for _, sizes := range perBody {
		sort.Sort(sort.Reverse(sort.IntSlice(sizes)))
	}
	require.Equal(t, map[string][]int{"A": {4, 4, 1}, "B": {3}, "C": {1}}, perBody)
	require.Len(t, seen, 13)
	for id, n := range seen {
		require.Equal(t, 1, n, "job %s sent once", id)
	}
	require.EqualValues(t, 5, f.tokens.Load(), "one token per call")
	require.EqualValues(t, 5, f.noted.Load(), "each call's answer noted once")
	require.Len(t, out, 13)
	for i := range 13 {
		o := out[fmt.Sprintf("t.%d", i)]
		require.True(t, o.sent, "job %d", i)
		if i == 4 || i == 5 {
			require.Equal(t, "1005", o.res.Code, "job %d gets its own failure", i)
			continue
		}
		require.True(t, o.res.OK(), "job %d", i)
		require.Equal(t, fmt.Sprintf("p-t.%d", i), o.res.ProviderID, "job %d gets its own result", i)
	}
}

func TestBatcherFlushesFullGroupBeforeLinger(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	b := startBatcher(t, f, 3, 1, time.Hour, time.Hour)
	start := time.Now()
	out := submitAll(context.Background(), b, "t", []string{"a", "b", "c"}, []string{"X", "X", "X"})
	require.Less(t, time.Since(start), 2*time.Second, "a full group does not wait for the linger")
	require.Len(t, f.snapshot(), 1)
	for id, o := range out {
		require.True(t, o.sent, id)
	}
}

func TestBatcherLingerSendsPartialGroup(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger = 120 * time.Millisecond
	b := startBatcher(t, f, 2000, 1, linger, time.Hour)
	start := time.Now()
	out := submitAll(context.Background(), b, "t", []string{"a", "b"}, []string{"X", "X"})
	took := time.Since(start)
	require.GreaterOrEqual(t, took, linger, "a partial group waits for more of its text")
	require.Less(t, took, linger+time.Second)
	calls := f.snapshot()
	require.Len(t, calls, 1)
	require.Len(t, calls[0], 2)
	require.True(t, out["t.0"].sent && out["t.1"].sent)
}

// TestBatcherGroupGrowsWhileItsTextArrives checks that a group is not sent
// while members keep joining within the linger, and that maxWait bounds
// the wait of its oldest member.
func TestBatcherGroupGrowsWhileItsTextArrives(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger, maxWait = 100 * time.Millisecond, 600 * time.Millisecond
	b := startBatcher(t, f, 2000, 1, linger, maxWait)
	var wg sync.WaitGroup
	start := time.Now()
	// One member every 40 ms for 1.2 s: never idle for a linger.
	for i := range 30 {
		job, msg := testJob("t", i, fmt.Sprint("u", i), "X")
		wg.Go(func() { submitSettle(context.Background(), b, job, msg) })
		time.Sleep(40 * time.Millisecond)
	}
	wg.Wait()
	took := time.Since(start)
	calls := f.snapshot()
	var sizes []int
	for _, c := range calls {
		sizes = append(sizes, len(c))
	}
	t.Logf("calls %v in %s", sizes, took)
	// 30 members over 1.2 s in groups cut at maxWait (600 ms, about 15
	// members): 2 or 3 calls. A linger from the oldest would make about
	// 10 calls of 3; a linger from the newest without maxWait, 1 call.
	require.GreaterOrEqual(t, len(calls), 2, "maxWait bounds the oldest member's wait")
	require.LessOrEqual(t, len(calls), 3, "a group grows while its text keeps arriving")
	require.GreaterOrEqual(t, sizes[0], 10)
}

// TestBatcherWaitsWhileCallsSettle checks that a partial group does not
// linger out while members of an earlier call are still being settled
// (their slots bring more jobs), and goes a linger after the last settles.
func TestBatcherWaitsWhileCallsSettle(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger = 50 * time.Millisecond
	b := startBatcher(t, f, 100, 1, linger, time.Hour)
	first := make(chan batchOutcome, 3)
	for i := range 3 {
		go func() { first <- b.submit(testJobMsg("t", i, fmt.Sprint("u", i), "X")) }()
	}
	for range 3 {
		require.True(t, (<-first).sent)
	}
	// The first call's three members are not settled yet.
	second := make(chan batchOutcome, 2)
	for i := 3; i < 5; i++ {
		job, msg := testJob("t", i, fmt.Sprint("u", i), "X")
		go func() { second <- submitSettle(context.Background(), b, job, msg) }()
	}
	time.Sleep(6 * linger)
	require.Len(t, f.snapshot(), 1, "no partial call while earlier members settle")
	b.settled()
	b.settled()
	time.Sleep(2 * linger)
	require.Len(t, f.snapshot(), 1, "one member still settling")
	settledAt := time.Now()
	b.settled()
	for range 2 {
		require.True(t, (<-second).sent)
	}
	require.GreaterOrEqual(t, time.Since(settledAt), linger, "the linger runs from the last settle")
	calls := f.snapshot()
	require.Len(t, calls, 2)
	require.Len(t, calls[1], 2)
}

// TestBatcherWaitsForJobsOnTheirWay checks that a partial group does not
// linger out while handlers hold jobs on their way to the batcher (on a
// loaded machine their checks take longer than the linger), goes a linger
// after the last of them arrives, and still goes at maxWait while one
// never does.
func TestBatcherWaitsForJobsOnTheirWay(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger, maxWait = 50 * time.Millisecond, 2 * time.Second
	b := startBatcher(t, f, 100, 1, linger, maxWait)
	onWay, leaves := b.arrive(), b.arrive()
	out := make(chan batchOutcome, 2)
	job, msg := testJob("t", 0, "u0", "X")
	go func() { out <- submitSettle(context.Background(), b, job, msg) }()
	time.Sleep(6 * linger)
	require.Empty(t, f.snapshot(), "no partial call while jobs are on their way")
	leaves() // a job that leaves without a send
	leaves() // says so once
	time.Sleep(6 * linger)
	require.Empty(t, f.snapshot(), "one job still on its way")
	job, msg = testJob("t", 1, "u1", "X")
	arrivedAt := time.Now()
	onWay()
	go func() { out <- submitSettle(context.Background(), b, job, msg) }()
	for range 2 {
		require.True(t, (<-out).sent)
	}
	require.GreaterOrEqual(t, time.Since(arrivedAt), linger, "the linger runs from the last arrival")
	calls := f.snapshot()
	require.Len(t, calls, 1)
	require.Len(t, calls[0], 2)

	// A job that never arrives holds partial groups for maxWait at most.
	_ = b.arrive()
	job, msg = testJob("t", 2, "u2", "X")
	start := time.Now()
	require.True(t, submitSettle(context.Background(), b, job, msg).sent)
	took := time.Since(start)
	require.GreaterOrEqual(t, took, maxWait)
	require.Less(t, took, maxWait+2*time.Second)
}

func TestBatcherCallsInFlightAtMostConcurrency(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{block: make(chan struct{})}
	b := startBatcher(t, f, 2, 2, 10*time.Millisecond, time.Hour)
	done := make(chan map[string]batchOutcome)
	go func() {
		// Six texts, two recipients each: six full groups.
		var tos, bodies []string
		for i := range 12 {
			tos, bodies = append(tos, fmt.Sprint("u", i)), append(bodies, fmt.Sprint("text", i/2))
		}
		done <- submitAll(context.Background(), b, "t", tos, bodies)
	}()
	require.Eventually(t, func() bool { return len(f.snapshot()) == 2 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.Len(t, f.snapshot(), 2, "no third call while two are in flight")
	close(f.block)
	out := <-done
	require.Len(t, f.snapshot(), 6)
	require.EqualValues(t, 2, f.maxIn.Load())
	for id, o := range out {
		require.True(t, o.sent, id)
	}
}

// TestBatcherPauseWins checks that jobs whose task was paused while they
// waited come back unsent, are never part of a call, and that the others
// of the same text are still sent.
func TestBatcherPauseWins(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger = 300 * time.Millisecond
	b := startBatcher(t, f, 100, 1, linger, time.Hour)
	var mu sync.Mutex
	out := map[string]batchOutcome{}
	var wg sync.WaitGroup
	for _, task := range []string{"keep", "pause"} {
		for i := range 5 {
			job, msg := testJob(task, i, fmt.Sprint(task, i), "same text")
			wg.Go(func() {
				o := submitSettle(context.Background(), b, job, msg)
				mu.Lock()
				out[job.ID] = o
				mu.Unlock()
			})
		}
	}
	time.Sleep(linger / 3)
	f.paused.Store("pause", true)
	wg.Wait()
	calls := f.snapshot()
	require.Len(t, calls, 1)
	require.Len(t, calls[0], 5)
	for _, m := range calls[0] {
		require.Equal(t, "keep", m.TaskID)
	}
	for i := range 5 {
		k, p := out[fmt.Sprint("keep.", i)], out[fmt.Sprint("pause.", i)]
		require.True(t, k.sent)
		require.False(t, p.sent)
		require.NoError(t, p.err, "handed back, not stopped: the handler takes the control path")
	}
}

// TestBatcherSweepsPausedJobs checks that waiting jobs of a paused task go
// back without waiting for their group's call (here: never, since the
// pacer holds the only worker).
func TestBatcherSweepsPausedJobs(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	deps := f.deps()
	hold := make(chan struct{})
	defer close(hold)
	deps.wait = func(ctx context.Context) error {
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newBatcher(deps, 1000, 20*time.Millisecond, time.Hour)
	b.start(ctx, 1)
	f.paused.Store("pause", true)
	// The first group is ready after 20 ms and the only worker waits for
	// a token forever; the sweep must still find the second group's job.
	go b.submit(testJobMsg("first", 0, "a", "X"))
	time.Sleep(50 * time.Millisecond)
	job, msg := testJob("other", 0, "b", "Y")
	start := time.Now()
	done := make(chan batchOutcome, 1)
	go func() { done <- b.submit(ctx, job, msg) }()
	time.Sleep(30 * time.Millisecond)
	f.paused.Store("other", true)
	select {
	case o := <-done:
		require.False(t, o.sent)
		require.NoError(t, o.err, "handed back, not stopped")
		require.Less(t, time.Since(start), time.Second)
	case <-time.After(3 * time.Second):
		t.Fatal("a paused job stayed in the batcher while its worker waited for a token")
	}
	require.Empty(t, f.snapshot(), "nothing was sent")
}

func testJobMsg(task string, i int, to, body string) (context.Context, *contract.Job, channels.Message) {
	job, msg := testJob(task, i, to, body)
	return context.Background(), job, msg
}

func TestBatcherWithdrawOnContextEnd(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	const linger = 200 * time.Millisecond
	b := startBatcher(t, f, 100, 1, linger, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	gone, gmsg := testJob("t", 0, "gone", "X")
	stay, smsg := testJob("t", 1, "stay", "X")
	res := make(chan batchOutcome, 2)
	go func() { res <- submitSettle(ctx, b, gone, gmsg) }()
	go func() { res <- submitSettle(context.Background(), b, stay, smsg) }()
	time.Sleep(linger / 4)
	cancel()
	first := <-res
	require.False(t, first.sent)
	require.ErrorIs(t, first.err, context.Canceled)
	second := <-res
	require.True(t, second.sent)
	calls := f.snapshot()
	require.Len(t, calls, 1)
	require.Len(t, calls[0], 1)
	require.Equal(t, "stay", calls[0][0].To, "a withdrawn job is never sent")
}

func TestBatcherStopHandsBackWaitingJobs(t *testing.T) {
	t.Parallel()
	f := &fakeProvider{}
	ctx, cancel := context.WithCancel(context.Background())
	b := newBatcher(f.deps(), 100, time.Hour, time.Hour)
	b.start(ctx, 1)
	res := make(chan batchOutcome, 3)
	for i := range 3 {
		go func() { res <- b.submit(testJobMsg("t", i, fmt.Sprint("u", i), "X")) }()
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	for range 3 {
		o := <-res
		require.False(t, o.sent)
		require.ErrorIs(t, o.err, errBatcherStopped)
	}
	o := b.submit(testJobMsg("t", 9, "late", "X"))
	require.ErrorIs(t, o.err, errBatcherStopped, "a stopped batcher takes nothing")
	require.Empty(t, f.snapshot())
}

func TestBatcherAdapterMistakes(t *testing.T) {
	t.Parallel()
	for name, send := range map[string]func(context.Context, []channels.Message) []channels.Result{
		"panic":         func(context.Context, []channels.Message) []channels.Result { panic("boom") },
		"short results": func(context.Context, []channels.Message) []channels.Result { return []channels.Result{{}} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := &fakeProvider{}
			deps := f.deps()
			deps.send = send
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := newBatcher(deps, 2, time.Hour, time.Hour)
			b.start(ctx, 1)
			out := submitAll(ctx, b, "t", []string{"a", "b"}, []string{"X", "X"})
			var shared0 int
			for id, o := range out {
				require.True(t, o.sent, id)
				require.Equal(t, contract.ClassRetryable, o.res.Class, id)
				if o.callShared {
					shared0++
				}
			}
			require.Equal(t, 1, shared0, "a call-wide failure is marked shared on all members but one")
		})
	}
}

func TestSharedFailures(t *testing.T) {
	t.Parallel()
	busy := channels.Result{Class: contract.ClassRetryable, Code: "503"}
	uidBusy := channels.Result{Class: contract.ClassRetryable, Code: "1005"}
	limited := channels.Result{Class: contract.ClassRateLimited, Code: "429"}
	gone := channels.Result{Class: contract.ClassPermanent, Code: "1001"}
	ok := channels.Result{ProviderID: "x"}
	tests := []struct {
		name string
		in   []channels.Result
		want []bool
	}{
		{"a single send", []channels.Result{busy}, []bool{false}},
		{"a call that failed as a whole counts once", []channels.Result{busy, busy, busy}, []bool{false, true, true}},
		{"each distinct call-level answer once", []channels.Result{busy, uidBusy, busy, limited, uidBusy, limited}, []bool{false, false, true, false, true, true}},
		{"permanent failures count per recipient", []channels.Result{gone, gone, busy, gone}, []bool{false, false, false, false}},
		{"successes are not failures", []channels.Result{ok, ok}, []bool{false, false}},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, sharedFailures(tt.in), tt.name)
	}
}

func TestCallAnswer(t *testing.T) {
	t.Parallel()
	ok := channels.Result{ProviderID: "x"}
	busy := channels.Result{Class: contract.ClassRetryable, Code: "1005"}
	gone := channels.Result{Class: contract.ClassPermanent, Code: "1001"}
	limited := func(d time.Duration) channels.Result {
		return channels.Result{Class: contract.ClassRateLimited, Code: "429", RetryAfter: d}
	}
	fatal := channels.Result{Class: contract.ClassAccountFatal, Code: "1001"}
	auth := channels.Result{Class: contract.ClassRetryable, Code: "401"}
	tests := []struct {
		name string
		in   []channels.Result
		want channels.Result
	}{
		{"all sent", []channels.Result{ok, ok}, channels.Result{}},
		{"partly failed counts as a successful call", []channels.Result{busy, ok, gone}, channels.Result{}},
		{"rate limited: the longest wait", []channels.Result{limited(time.Second), ok, limited(3 * time.Second)}, limited(3 * time.Second)},
		{"rate limit beats account fatal", []channels.Result{fatal, limited(time.Second)}, limited(time.Second)},
		{"account fatal", []channels.Result{ok, fatal}, fatal},
		{"auth", []channels.Result{busy, auth}, auth},
		{"all failed", []channels.Result{busy, gone}, busy},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, callAnswer(tt.in), tt.name)
	}
}

func TestJobsInFlight(t *testing.T) {
	t.Parallel()
	// Per lane; the account's three lanes together hold at most
	// maxJobsInFlight (30,000 before: 10,000 each), each at least a call.
	tests := []struct{ concurrency, maxBatch, normal, other int }{
		{4, 1, 4, 4},          // single sends: the in-flight request cap, as before
		{1, 2000, 4000, 2000}, // WxPusher: batchFill calls' worth, a call at least
		{2, 2000, maxJobsInFlight / 2, 2500},
		{8, 100, 1600, 800},
		{1000, 1 << 40, maxJobsInFlight, maxJobsInFlight}, // a lane holds one call; no overflow
	}
	for _, tt := range tests {
		a := &contract.Account{Concurrency: tt.concurrency, MaxBatch: tt.maxBatch}
		n, h, l := jobsInFlight(a, contract.PriorityNormal), jobsInFlight(a, contract.PriorityHigh), jobsInFlight(a, contract.PriorityLow)
		require.Equal(t, tt.normal, n, "normal lane, concurrency %d max_batch %d", tt.concurrency, tt.maxBatch)
		require.Equal(t, tt.other, h, "high lane, concurrency %d max_batch %d", tt.concurrency, tt.maxBatch)
		require.Equal(t, h, l)
		if tt.maxBatch > 1 && tt.maxBatch <= maxJobsInFlight/4 {
			require.LessOrEqual(t, n+h+l, maxJobsInFlight, "one budget across the lanes")
		}
	}
}

// TestBatcherSurvivesPanics makes the pacer, admit and the call hook panic
// once each (the batch worker runs outside the consume loop's panic guard:
// an account with a rate of 1e19 once overflowed the pacer there and killed
// every replica that took its lease). Each panic is logged with its stack;
// the jobs it caught before their call come back unsent (for redelivery),
// the ones whose call was made keep their results, and the worker goes on
// sending.
func TestBatcherSurvivesPanics(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	f := &fakeProvider{}
	deps := f.deps()
	deps.log = slog.New(slog.NewTextHandler(&logs, nil))
	var waits, admits, hooks atomic.Int64
	wait, admit, called := deps.wait, deps.admit, deps.called
	deps.wait = func(ctx context.Context) error {
		if waits.Add(1) == 1 {
			var recent []int
			_ = recent[len(recent)-1+int(waits.Load())] // index out of range, as the pacer did
		}
		return wait(ctx)
	}
	deps.admit = func(job *contract.Job) bool {
		if job.To == "admit-panics" && admits.Add(1) == 1 {
			panic("admit exploded")
		}
		return admit(job)
	}
	deps.called = func(res []channels.Result, d time.Duration) {
		if hooks.Add(1) == 2 {
			panic("hook exploded")
		}
		called(res, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// Groups of one are ready at once; the sweep (which asks admit too,
	// and would take admit's one panic) ticks every linger: a minute, past
	// the test even under the race detector.
	b := newBatcher(deps, 1, time.Minute, time.Minute)
	b.start(ctx, 1)

	// 1. The pacer panics before anything is taken: the job waits for the
	// next round and is sent.
	job, msg := testJob("t", 0, "u0", "hello")
	start := time.Now()
	o := submitSettle(ctx, b, job, msg)
	require.True(t, o.sent, "sent after the worker recovered: %+v", o)
	require.GreaterOrEqual(t, time.Since(start), shared.SupervisePause/2, "the worker paused after the panic")

	// 2. The call hook panics after the call: the results still arrive.
	job, msg = testJob("t", 1, "u1", "hello")
	o = submitSettle(ctx, b, job, msg)
	require.True(t, o.sent)
	require.Equal(t, "p-t.1", o.res.ProviderID)

	// 3. admit panics while the call is being assembled: that job comes
	// back unsent with the panic as its error; nothing was sent for it.
	job, msg = testJob("t", 2, "admit-panics", "hello")
	o = submitSettle(ctx, b, job, msg)
	require.False(t, o.sent)
	var pe *shared.PanicError
	require.ErrorAs(t, o.err, &pe)
	require.Equal(t, "admit exploded", pe.Value)
	for _, call := range f.snapshot() {
		for _, m := range call {
			require.NotEqual(t, "admit-panics", m.To)
		}
	}

	// And the worker still sends.
	job, msg = testJob("t", 3, "u3", "hello")
	require.True(t, submitSettle(ctx, b, job, msg).sent)

	out := logs.String()
	require.Equal(t, 3, strings.Count(out, "PANIC recovered"), out)
	require.Contains(t, out, "index out of range")
	require.Contains(t, out, "batcher_test.go", "the stack is logged")
}
