package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// batchLinger is how long a group may go without a new member before it
// is sent although not full, and batchMaxWait bounds how long its oldest
// member waits. While members of earlier calls are still being settled
// (ledger, events, ack) the linger does not run: their slots free up when
// they are done, and more jobs arrive then. Nor does it while the
// account's handlers hold jobs on their way to the batcher (their checks
// before the send): on a loaded machine those checks take longer than the
// linger, and a quiet spell then means slow handlers, not a text that
// stopped coming. When the linger runs, either the lane's jobs all wait
// in the batcher or no more have come.
//
// Measured with 10,000 recipients and 3 texts at 20 calls/s (ideal: 6
// calls): a linger of 150 ms counted from a group's oldest member took 14
// calls (groups went half full whenever jobs arrived more slowly than
// max_batch per linger); counted from its newest member, 8 or 9 (the
// consume loop delivers nothing for the ~200 ms it takes 2,000 handlers to
// settle a call, so remainders went alone); with the settling pause, 6.
// A small task or a lone retry still waits only 150 ms, well under one
// WxPusher call interval (500 ms).
const (
	batchLinger  = 150 * time.Millisecond
	batchMaxWait = 2 * time.Second
)

// batchFill is how many full calls' worth of jobs a batch account holds in
// flight per concurrent call (see jobsInFlight). A group fills only while
// enough jobs of its text are waiting at once: with exactly
// concurrency×max_batch jobs in flight, 10,000 recipients cycling through
// 3 texts took 12-13 calls (each group a third to a half full); with four
// calls' worth, 6, the ideal. Up to four interleaved texts fill their calls.
const batchFill = 4

// maxJobsInFlight bounds the jobs (and handler goroutines) one batch account
// holds at once.
const maxJobsInFlight = 10_000

// jobsInFlight is a lane consumer's MaxAckPending and its number of job
// handlers. For max_batch 1 it is concurrency, the in-flight request cap.
// For a batch account concurrency counts provider calls in flight, each
// carrying up to max_batch jobs: the account holds batchFill times that
// many, at most maxJobsInFlight over its three lanes together. The normal
// lane, where bulk work runs, gets half of it, high and low a quarter
// each, and every lane at least one full call.
func jobsInFlight(a *contract.Account, p contract.Priority) int {
	if a.MaxBatch <= 1 {
		return a.Concurrency
	}
	batch := min(a.MaxBatch, maxJobsInFlight)
	account := min(a.Concurrency*batch*batchFill, maxJobsInFlight)
	share := account / 4
	if p == contract.PriorityNormal {
		share = account / 2
	}
	return max(share, batch)
}

// errBatcherStopped is what a job waiting in a stopped batcher gets back.
var errBatcherStopped = errors.New("dispatch stopping: job left for redelivery")

// batchDeps is what a batcher needs from its account.
type batchDeps struct {
	// wait takes one token of the account's pacer (one per call).
	wait func(ctx context.Context) error
	// admit reports whether a job may be sent now: its task is neither
	// paused nor cancelled and the account may send (mustNotSend).
	admit func(job *contract.Job) bool
	// send makes one provider call.
	send func(ctx context.Context, msgs []channels.Message) []channels.Result
	// called sees every call's results once, in order (adaptive pacing,
	// auth-failure counting, metrics).
	called func(res []channels.Result, latency time.Duration)
	// log receives recovered panics. Defaults to discarding.
	log *slog.Logger
}

// batcher merges the jobs of one batch account (max_batch > 1) whose
// rendered text is identical into provider calls of up to max_batch
// recipients. Job handlers submit their message after every per-job check
// and wait for their own Result; a group is sent when it is full, when no
// new member joined it for linger (not counting time in which members of
// earlier calls were still settling or handlers held jobs on their way to
// it), or when its oldest member waited maxWait. Each call takes one
// pacer token, and at most concurrency calls are in flight.
//
// A pause or cancel of the task, or an account that must not send
// (disabled or paused), wins over waiting messages: every member is
// checked again just before its call, and every waiting message each
// batchLinger; the ones that may not be sent go back to their handlers
// unsent, which then take the same path as a job that finds the task
// paused on arrival.
type batcher struct {
	deps     batchDeps
	maxBatch int
	linger   time.Duration
	maxWait  time.Duration

	// gate is held by the one worker looking for a ready group and waiting
	// for a token, so the group it found is still there when it has one.
	gate sync.Mutex
	// wake tells that worker a group became full, the first group
	// appeared or the batcher went quiet (quietLocked); a later group is
	// ready no sooner than the groups the worker already waits for, and a
	// new member only delays its group.
	wake chan struct{}

	mu      sync.Mutex
	groups  map[string]*batchGroup // by body
	pending int
	stopped bool
	// settling counts members of finished calls whose handlers have not
	// called settled yet, arriving the jobs handlers hold on their way to
	// submit (arrive); quietAt is when both last fell to zero.
	settling, arriving int
	quietAt            time.Time
}

// batchGroup is the waiting messages with one text, oldest first.
type batchGroup struct {
	items []*batchItem
	// last is when the newest member joined.
	last time.Time
}

// readyAt is when g is sent unless it fills first, earlier calls are
// still settling or jobs are on their way. Call with b.mu held.
func (b *batcher) readyAt(g *batchGroup) time.Time {
	w := g.items[0].at.Add(b.maxWait)
	if b.settling > 0 || b.arriving > 0 {
		return w
	}
	t := g.last
	if b.quietAt.After(t) {
		t = b.quietAt
	}
	if t = t.Add(b.linger); w.Before(t) {
		return w
	}
	return t
}

// ready reports whether g is to be sent now. Call with b.mu held.
func (b *batcher) ready(g *batchGroup, now time.Time) bool {
	return len(g.items) >= b.maxBatch || !now.Before(b.readyAt(g))
}

// batchItem is one job waiting in the batcher.
type batchItem struct {
	ctx context.Context
	job *contract.Job
	msg channels.Message
	at  time.Time
	// out is set under batcher.mu once the item has left its group (taken
	// for a call, handed back, or withdrawn); it is then never sent again.
	out bool
	// answered is set when the worker that took the item has given it its
	// outcome (answer); only that worker reads and writes it.
	answered bool
	done     chan batchOutcome
}

// batchOutcome is what a submitted job gets back.
type batchOutcome struct {
	res     channels.Result
	latency time.Duration
	// started is when the call began.
	started time.Time
	// sent is true when the job was part of a provider call; res is its
	// result. When false, err says why nothing was sent (stopping, or the
	// handler's context ended); a nil err means the job was handed back
	// because admit refused it.
	sent bool
	err  error
	// callShared marks a call-level failure an earlier member of the same
	// call got as well (see sharedFailures and contract.Event.CallShared).
	callShared bool
}

func newBatcher(deps batchDeps, maxBatch int, linger, maxWait time.Duration) *batcher {
	if deps.log == nil {
		deps.log = slog.New(slog.DiscardHandler)
	}
	return &batcher{deps: deps, maxBatch: maxBatch, linger: linger, maxWait: max(maxWait, linger),
		wake: make(chan struct{}, 1), groups: map[string]*batchGroup{}}
}

// start runs calls workers until ctx is cancelled; then every job still
// waiting goes back to its handler unsent (errBatcherStopped). Calls under
// way finish with their own context.
func (b *batcher) start(ctx context.Context, calls int) {
	for range max(calls, 1) {
		go b.worker(ctx)
	}
	go func() {
		// Waiting jobs are checked every linger, also while the workers
		// wait out a Retry-After pause, so a pause or cancel reaches them
		// without waiting for their group's call.
		t := time.NewTicker(b.linger)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				b.stop()
				return
			case <-t.C:
				func() {
					defer shared.Recover(b.deps.log, "batch sweep", nil)
					b.sweep()
				}()
			}
		}
	}()
}

// submit queues msg (the message of job) and waits for its outcome. ctx is
// the handler's context; the call carrying msg uses it too, so a stop that
// abandons handlers abandons their call. When the outcome is sent, the
// caller must call settled once it has recorded it.
func (b *batcher) submit(ctx context.Context, job *contract.Job, msg channels.Message) batchOutcome {
	it := &batchItem{ctx: ctx, job: job, msg: msg, at: time.Now(), done: make(chan batchOutcome, 1)}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return batchOutcome{err: errBatcherStopped}
	}
	g := b.groups[msg.Body]
	if g == nil {
		g = &batchGroup{}
		b.groups[msg.Body] = g
	}
	g.items = append(g.items, it)
	g.last = it.at
	b.pending++
	wake := len(g.items) == b.maxBatch || b.pending == 1
	b.mu.Unlock()
	if wake {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	select {
	case o := <-it.done:
		return o
	case <-ctx.Done():
	}
	if b.withdraw(it) {
		return batchOutcome{err: ctx.Err()}
	}
	// Already in a call (which uses this context, so it ends soon) or
	// handed back.
	return <-it.done
}

// settled tells the batcher a sent job's handler is done with its result,
// so its consumer slot is about to free up.
func (b *batcher) settled() {
	b.mu.Lock()
	b.settling--
	quiet := b.quietLocked()
	b.mu.Unlock()
	b.wakeIf(quiet)
}

// arrive tells the batcher that a handler holds a job of its account on
// the way to submit, so partial groups keep waiting for it (within
// maxWait). The handler calls the returned func when the job is about to
// be submitted or leaves without a send; calls after the first do nothing.
func (b *batcher) arrive() (arrived func()) {
	b.mu.Lock()
	b.arriving++
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.arriving--
			quiet := b.quietLocked()
			b.mu.Unlock()
			b.wakeIf(quiet)
		})
	}
}

// quietLocked reports whether nothing settles and nothing is on its way
// any more, and if so starts partial groups' lingers over from now. Call
// with b.mu held.
func (b *batcher) quietLocked() bool {
	if b.settling > 0 || b.arriving > 0 {
		return false
	}
	b.quietAt = time.Now()
	return true
}

// wakeIf tells the worker to look at the groups again.
func (b *batcher) wakeIf(quiet bool) {
	if !quiet {
		return
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// withdraw removes a waiting item; false means it already left its group.
func (b *batcher) withdraw(it *batchItem) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if it.out {
		return false
	}
	it.out = true
	b.pending--
	if g := b.groups[it.msg.Body]; g != nil {
		if i := slices.Index(g.items, it); i >= 0 {
			g.items = slices.Delete(g.items, i, i+1)
		}
		if len(g.items) == 0 {
			delete(b.groups, it.msg.Body)
		}
	}
	return true
}

// stop hands every waiting item back unsent and refuses new ones.
func (b *batcher) stop() {
	b.mu.Lock()
	b.stopped = true
	var back []*batchItem
	for _, g := range b.groups {
		for _, it := range g.items {
			it.out = true
			back = append(back, it)
		}
	}
	clear(b.groups)
	b.pending = 0
	b.mu.Unlock()
	for _, it := range back {
		it.done <- batchOutcome{err: errBatcherStopped}
	}
}

func (b *batcher) worker(ctx context.Context) {
	for b.round(ctx) {
	}
}

// round waits for one ready group and makes its call; it returns false
// once ctx has ended. A panic (in the pacer, admit, take, the called hook)
// is logged with its stack instead of killing the process: the members not
// answered yet go back to their handlers unsent, which leave their jobs
// for redelivery without spending an attempt, and the worker carries on
// after a pause.
func (b *batcher) round(ctx context.Context) (more bool) {
	var batch []*batchItem
	defer shared.Recover(b.deps.log, "batch worker", func(p any) {
		for _, it := range batch {
			b.answer(it, batchOutcome{err: &shared.PanicError{Value: p}})
		}
		more = sleep(ctx, shared.SupervisePause) == nil
	})
	if batch = b.next(ctx); batch == nil {
		return false
	}
	b.call(batch)
	return true
}

// answer gives a taken item its outcome, once.
func (b *batcher) answer(it *batchItem, o batchOutcome) {
	if !it.answered {
		it.answered = true
		it.done <- o
	}
}

// next waits for a ready group and a token, then takes up to maxBatch
// messages of the best group. It returns nil when ctx ends.
func (b *batcher) next(ctx context.Context) []*batchItem {
	b.gate.Lock()
	defer b.gate.Unlock()
	for {
		if !b.waitReady(ctx) {
			return nil
		}
		if err := b.deps.wait(ctx); err != nil {
			return nil
		}
		// Taken after the token: the group kept filling meanwhile.
		if batch := b.take(); len(batch) > 0 {
			return batch
		}
		// Everything was handed back or withdrawn while we waited: the
		// token is spent without a call, which only slows the account.
	}
}

// waitReady blocks until some group is full or has lingered.
func (b *batcher) waitReady(ctx context.Context) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		ready, next := b.readyLocked(time.Now())
		b.mu.Unlock()
		if ready {
			return true
		}
		var tick <-chan time.Time
		if next > 0 {
			if timer == nil {
				timer = time.NewTimer(next)
			} else {
				timer.Reset(next)
			}
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-b.wake:
		case <-tick:
		}
	}
}

// readyLocked reports whether a group is ready, else how long until the
// first will be (0: no group waits).
func (b *batcher) readyLocked(now time.Time) (bool, time.Duration) {
	var next time.Duration
	for _, g := range b.groups {
		if b.ready(g, now) {
			return true, 0
		}
		if d := b.readyAt(g).Sub(now); next == 0 || d < next {
			next = d
		}
	}
	return false, next
}

// take removes up to maxBatch items of the ready group whose oldest item is
// oldest (or, when none is ready any more, of the oldest group).
func (b *batcher) take() []*batchItem {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var (
		best      *batchGroup
		bestBody  string
		bestReady bool
	)
	for body, g := range b.groups {
		ready := b.ready(g, now)
		if best == nil || ready && !bestReady || ready == bestReady && g.items[0].at.Before(best.items[0].at) {
			best, bestBody, bestReady = g, body, ready
		}
	}
	if best == nil {
		return nil
	}
	n := min(len(best.items), b.maxBatch)
	batch := best.items[:n:n]
	for _, it := range batch {
		it.out = true
	}
	b.pending -= n
	if n == len(best.items) {
		delete(b.groups, bestBody)
	} else {
		best.items = slices.Clone(best.items[n:])
	}
	return batch
}

// sweep hands back the waiting items admit refuses. admit is asked once
// per task (and test flag) per sweep.
func (b *batcher) sweep() {
	b.mu.Lock()
	if b.pending == 0 {
		b.mu.Unlock()
		return
	}
	all := make([]*batchItem, 0, b.pending)
	for _, g := range b.groups {
		all = append(all, g.items...)
	}
	b.mu.Unlock()
	type key struct {
		task string
		test bool
	}
	admitted := map[key]bool{}
	for _, it := range all {
		k := key{it.job.TaskID, it.job.Test}
		ok, known := admitted[k]
		if !known {
			ok = b.deps.admit(it.job)
			admitted[k] = ok
		}
		if !ok && b.withdraw(it) {
			it.done <- batchOutcome{}
		}
	}
}

// call checks every member once more, makes one provider call for the ones
// that may still be sent and gives each its own result.
func (b *batcher) call(batch []*batchItem) {
	members := make([]*batchItem, 0, len(batch))
	msgs := make([]channels.Message, 0, len(batch))
	for _, it := range batch {
		// A pause or cancel that came while this job waited wins: no new
		// send starts after it.
		if !b.deps.admit(it.job) {
			b.answer(it, batchOutcome{})
			continue
		}
		members = append(members, it)
		msgs = append(msgs, it.msg)
	}
	if len(members) == 0 {
		return
	}
	start := time.Now()
	res := b.safeSend(members[0].ctx, msgs)
	latency := time.Since(start)
	// The call was made: a panic in the hook must not lose its results
	// (handing them back unsent would send them again).
	func() {
		defer shared.Recover(b.deps.log, "batch call hook", nil)
		b.deps.called(res, latency)
	}()
	b.mu.Lock()
	b.settling += len(members)
	b.mu.Unlock()
	marks := sharedFailures(res)
	for i, it := range members {
		b.answer(it, batchOutcome{res: res[i], latency: latency, started: start, sent: true, callShared: marks[i]})
	}
}

// safeSend makes the call, turning an adapter panic or a wrong number of
// results into a retryable failure of every member (the worker runs outside
// the consume loop's panic guard).
func (b *batcher) safeSend(ctx context.Context, msgs []channels.Message) (res []channels.Result) {
	defer func() {
		if p := recover(); p != nil {
			res = channels.Fail(len(msgs), channels.Result{Class: contract.ClassRetryable, Code: "panic",
				Err: fmt.Sprintf("adapter panic: %v", p)})
		}
	}()
	res = b.deps.send(ctx, msgs)
	if len(res) != len(msgs) {
		// Never guess which answer belongs to which recipient.
		res = channels.Fail(len(msgs), channels.Result{Class: contract.ClassRetryable, Code: "adapter",
			Err: fmt.Sprintf("adapter returned %d results for %d messages", len(res), len(msgs))})
	}
	return res
}

// sharedFailures marks the results that repeat a call-level failure an
// earlier member of the same call got: the same class and code of a kind
// that is about the call or the provider, not the recipient (rate limited,
// retryable, account fatal). The circuit breaker and the rate-limit metric
// count such an answer once per call, as for a single send; permanent and
// per-recipient-delay failures stay counted per recipient.
func sharedFailures(res []channels.Result) []bool {
	type key struct {
		class contract.ErrorClass
		code  string
	}
	var seen map[key]bool
	marks := make([]bool, len(res))
	for i, r := range res {
		switch r.Class {
		case contract.ClassRateLimited, contract.ClassRetryable, contract.ClassAccountFatal:
		default:
			continue
		}
		k := key{r.Class, r.Code}
		if seen == nil {
			seen = map[key]bool{}
		}
		marks[i] = seen[k]
		seen[k] = true
	}
	return marks
}

// callAnswer is the answer that speaks for a whole call in adaptive pacing
// and auth-failure counting: a rate limit (the longest Retry-After), else an
// account-fatal answer, else a 401/403, else success when any member was
// accepted, else the first member's failure.
func callAnswer(res []channels.Result) channels.Result {
	limited, fatal, auth, ok := -1, -1, -1, false
	for i, r := range res {
		switch {
		case r.Class == contract.ClassRateLimited:
			if limited < 0 || r.RetryAfter > res[limited].RetryAfter {
				limited = i
			}
		case r.Class == contract.ClassAccountFatal:
			if fatal < 0 {
				fatal = i
			}
		case r.Code == "401" || r.Code == "403":
			if auth < 0 {
				auth = i
			}
		case r.OK():
			ok = true
		}
	}
	switch {
	case limited >= 0:
		return res[limited]
	case fatal >= 0:
		return res[fatal]
	case auth >= 0:
		return res[auth]
	case ok || len(res) == 0:
		return channels.Result{}
	}
	return res[0]
}

// noteCall feeds one batch call to adaptive pacing and metrics once: a
// call is one answer, rate limited when any member was, as rate_per_sec
// counts calls.
func (r *accountRunner) noteCall(res []channels.Result, latency time.Duration) {
	r.svc.cfg.metrics.Latency(r.name, latency)
	r.svc.cfg.metrics.BatchSize(r.name, len(res))
	if a := callAnswer(res); a.OK() {
		r.noteSuccess()
	} else {
		r.noteFailure(a, r.log)
	}
}

// newAccountBatcher builds the batcher of a batch account.
// wait takes the account's token for one call (and checks the lease).
func (r *accountRunner) newAccountBatcher(maxBatch int, wait func(context.Context) error) *batcher {
	return newBatcher(batchDeps{
		wait: wait,
		admit: func(job *contract.Job) bool {
			if blocked, _ := r.mustNotSend(); blocked {
				return false
			}
			return controlLets(r.svc.controls.Get(job.TaskID), job)
		},
		send: func(ctx context.Context, msgs []channels.Message) []channels.Result {
			_, sender := r.current()
			return sender.Send(ctx, msgs)
		},
		called: r.noteCall,
		log:    r.log,
	}, maxBatch, batchLinger, batchMaxWait)
}
