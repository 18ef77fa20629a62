package dispatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/shared"
)

// ackWait is the job consumers' ack wait; the consume loop keeps slow sends
// and jobs waiting for a token alive with progress acks every second. It is
// short because the jobs a killed process held fill its lanes'
// MaxAckPending until it runs out: the replica taking the account over
// sends again within about that long (lease.Presence takes the lease sooner).
const ackWait = 2 * time.Second

// consumerConfig is the durable consumer of one lane of an account. The
// consumers are not pinned: only the holder of the account's lease
// (lease.go) consumes them. Each lane's MaxAckPending is the account's
// concurrency, so a lane's held jobs never stop another lane's delivery;
// the in-flight cap across lanes is the scheduler's (sched.go).
//
// Their state is kept in memory: the server rewrote each busy consumer's
// state file about ten times a second, so the cost grew with the number
// of accounts sending (300 accounts sharing 15,000/s spent a third of the
// CPU in those writes and ran at a ninth of the rate of 3). JOBS is a work
// queue, so the jobs in the stream are exactly the unacknowledged ones: a
// consumer lost with a server restart is created again and delivers them
// all. Their delivery counts are lost with it, so the jobs a fresh
// consumer finds already queued are checked for an earlier send like a
// redelivery (laneConsumer, delivery.recheck).
func consumerConfig(a *contract.Account, p contract.Priority) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.DispatchConsumer(a.Name, p),
		Description:   "dispatch: " + string(p) + " jobs of account " + a.Name,
		FilterSubject: contract.JobSubject(a.Name, p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: jobsInFlight(a, p), // concurrency, or enough jobs to fill a batch account's calls (batcher.go)
		MemoryStorage: true,
	}
}

// accountRunner owns one account's consumer, pacer, caps and sender.
type accountRunner struct {
	svc   *Service
	name  string
	pacer *pacer
	log   *slog.Logger
	// lanes are the current session's, nil between sessions (the lane
	// finder, lanes.go, reads them); inSession is set while a session
	// starts or runs, and wake nudges a sleeping runner (idle.go).
	lanes     atomic.Pointer[sessionLanes]
	inSession atomic.Bool
	wake      chan struct{}
	// expectedUntil is the deadline (Unix nanoseconds) of the last wake
	// notice that named the account: until then its runner wants the
	// lease even before the lane finder shows its jobs (idle.go).
	expectedUntil atomic.Int64
	// healthNote is the health value this runner last wrote (health.go).
	healthNote healthNote
	// slept is what this runner knows of the asleep mark it left (nil
	// when none); its sessions read and write it, one at a time.
	slept *sleepNote
	// batch merges sends of identical text into one call, for accounts
	// whose max_batch is above 1 (nil otherwise, so single sends take no
	// extra hop). Each ownership session makes its own; the handlers of a
	// session read it, and it is replaced only after they are done.
	batch *batcher

	mu          sync.RWMutex
	acct        *contract.Account
	sender      channels.Sender
	caps        *capTracker
	paused      bool
	pauseReason string
	pausedSince time.Time
	authFails   int
	lastActive  time.Time

	ctx     context.Context
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newAccountRunner(parent context.Context, s *Service, a *contract.Account, sender channels.Sender) *accountRunner {
	ctx, cancel := context.WithCancel(parent)
	r := &accountRunner{
		svc:     s,
		name:    a.Name,
		acct:    a,
		sender:  sender,
		pacer:   newPacer(a.RatePerSec, a.MinRatePerSec, a.Burst),
		log:     s.log.With(shared.KeyAccount, a.Name),
		ctx:     ctx,
		cancel:  cancel,
		stopped: make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
	r.configurePacer(a)
	s.cfg.metrics.Account(a.Name, a.RatePerSec)
	return r
}

// canUpdateInPlace reports whether a change leaves the consumer as it is.
func (r *accountRunner) canUpdateInPlace(a *contract.Account) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct.Concurrency == a.Concurrency && r.acct.MaxBatch == a.MaxBatch
}

// update applies an account edit. An edit is also how an operator clears a
// pause: whoever fixed the token says so by saving the account.
func (r *accountRunner) update(a *contract.Account, sender channels.Sender) {
	r.mu.Lock()
	old := r.sender
	r.acct, r.sender = a, sender
	wasPaused := r.paused
	r.paused, r.pauseReason, r.authFails = false, "", 0
	r.mu.Unlock()
	closeSender(old)
	r.configurePacer(a)
	if wasPaused {
		r.log.Info("account edited; pause cleared")
	}
	r.writeHealth(r.ctx)
}

func closeSender(s channels.Sender) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

func (r *accountRunner) current() (*contract.Account, channels.Sender) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct, r.sender
}

// capTracker returns the account's cap tracker, starting it on first use.
func (r *accountRunner) capTracker(ctx context.Context) (*capTracker, error) {
	r.mu.RLock()
	c := r.caps
	r.mu.RUnlock()
	if c != nil {
		return c, nil
	}
	c, err := newCapTracker(r.ctx, r.svc.sends, r.name, r.log)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.caps == nil {
		r.caps = c
	}
	c = r.caps
	r.mu.Unlock()
	return c, nil
}

// run takes part in the account until the runner stops: it sleeps until
// the account has work (idle.go), waits for its lease, sends while it
// holds it and has work, and sleeps again.
func (r *accountRunner) run() {
	defer close(r.stopped)
	defer r.forgetSlept()
	ctx := r.ctx
	select {
	case <-r.svc.ready:
	case <-ctx.Done():
		return
	}
	l := lease.New(r.svc.leases, r.name, r.svc.leaseTTL)
	l.Owner = lease.OwnerID(r.svc.share.Replica) // groups this replica's leases (lease.FairShare)
	l.HolderGone, l.Conn = r.svc.presence.Gone, r.svc.conn.State
	// Without its normal lane's consumer or its asleep mark the account
	// has one session anyway, which leaves one of them: jobs that come
	// later are then fresh (idle.go).
	setUp := r.setUp(ctx)
	for !setUp || r.waitForWork(ctx) {
		if !r.acquireWhileWanted(ctx, l, !setUp) {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		r.inSession.Store(true)
		r.healthNote.forget() // another replica may have written it since
		// The reporter lives as long as the session: a sleeping account
		// has no timer (at 1,000 sleeping accounts their tickers were most
		// of an idle dispatch's CPU).
		sessionHealth, endHealth := context.WithCancel(ctx)
		go shared.Supervise(sessionHealth, r.log, "account health reporter", r.reportHealth)
		r.ownSafely(ctx, l)
		endHealth()
		r.inSession.Store(false)
		if ctx.Err() != nil {
			return
		}
		setUp = true
	}
}

// ownSafely is own, surviving a panic: it is logged with its stack, the
// session ends (its unacknowledged jobs are redelivered to whoever sends
// for the account next) and, after a pause, this runner competes for the
// lease again. The lease is not released: it runs out, so another replica
// may take the account meanwhile.
func (r *accountRunner) ownSafely(ctx context.Context, l *lease.Lease) {
	defer shared.Recover(r.log, "account session", func(any) {
		l.Drop()
		_ = sleep(ctx, shared.SupervisePause)
	})
	r.own(ctx, l)
}

// errSessionPanic ends a session one of whose goroutines panicked (logged
// where it was recovered).
var errSessionPanic = errors.New("a panic ended the session")

// guard runs fn in a session's goroutine, ending the session (cause
// errSessionPanic) when fn panics, after logging it.
func (r *accountRunner) guard(end context.CancelCauseFunc, what string, fn func()) func() {
	return func() {
		defer shared.Recover(r.log, what, func(p any) { end(errSessionPanic) })
		fn()
	}
}

// own sends the account's jobs while this runner holds its lease: it
// consumes the three lanes through one scheduler and refreshes the lease.
// It returns when the runner stops (releasing the lease once the in-flight
// sends are done, so another replica takes over at once) or when the lease
// is lost (no send starts after that).
func (r *accountRunner) own(ctx context.Context, l *lease.Lease) {
	a, _ := r.current()
	// The session: ends on stop or on a lost lease. No new send starts
	// after it ends; in-flight ones finish.
	sctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	// This process has just become the account's sender: its bucket filled
	// up while it stood by, and the previous owner may have spent its own
	// burst moments ago. Start from an empty one (see pacer.empty).
	r.pacer.empty()
	sched := newScheduler(r.pacer, a.Concurrency)
	// Lower lanes wait until the server has said the higher ones are
	// empty (watchBacklog).
	sched.setBacklog(laneHigh, true)
	sched.setBacklog(laneNormal, true)
	r.batch = nil
	if a.MaxBatch > 1 {
		// For a batch account concurrency is provider calls in flight; each
		// call takes one token, and is made only while the lease holds.
		r.batch = r.newAccountBatcher(a.MaxBatch, func(ctx context.Context) error {
			if err := r.pacer.wait(ctx); err != nil {
				return err
			}
			if !l.Valid() {
				end(lease.ErrLost)
				return lease.ErrLost
			}
			return nil
		})
		r.batch.start(sctx, a.Concurrency)
	}

	// The lease is kept until the in-flight sends are done, even while
	// stopping, so nobody else starts before them.
	kctx, stopKeeping := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(r.guard(end, "lease keeper", func() { r.keepLease(kctx, l, end) }))
	bg.Go(r.guard(end, "scheduler", func() {
		if err := sched.run(sctx, l.Valid); errors.Is(err, lease.ErrLost) {
			end(lease.ErrLost)
		}
	}))

	// More accounts than this replica's share (another replica joined):
	// hand this one over, gracefully, like a stop.
	gaveBack := false
	bg.Go(r.guard(end, "give-back check", func() {
		t := time.NewTicker(lease.Refresh)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if r.svc.share.ShouldGiveBack() {
					gaveBack = true
					end(lease.ErrGiveBack)
					return
				}
			}
		}
	}))

	lanes := newSessionLanes(sctx, end, l.Valid, r, a, sched)
	var keeper sync.WaitGroup
	if lanes.start() {
		r.lanes.Store(lanes)
		keeper.Go(r.guard(end, "lane keeper", lanes.keep))
		bg.Go(r.guard(end, "backlog watch", func() { watchBacklog(sctx, sched, lanes) }))
		bg.Go(r.guard(end, "idle check", func() { r.endWhenIdle(sctx, end, sched, lanes) }))
	}
	<-sctx.Done()
	r.lanes.Store(nil)
	sched.end()
	keeper.Wait()
	lanes.wait()
	stopKeeping()
	bg.Wait()
	if !gaveBack {
		r.svc.share.Released()
	}
	r.svc.cfg.metrics.SessionEnded(sessionEndCause(context.Cause(sctx)))
	if errors.Is(context.Cause(sctx), lease.ErrLost) {
		l.Drop()
		r.log.Warn("lost the account's lease; stopped sending (another process may send for it now)")
		return
	}
	if errors.Is(context.Cause(sctx), errIdle) && ctx.Err() == nil {
		r.sleepDeeply(ctx, l)
	}
	if err := l.Release(context.WithoutCancel(ctx)); err != nil {
		r.log.Warn("could not release the account's lease; another replica takes over when it expires", "err", err)
		return
	}
	if errors.Is(context.Cause(sctx), errIdle) {
		r.log.Debug("session ended: no work for a while; lease released")
		return
	}
	r.log.Info("released the account to another replica", "reason", context.Cause(sctx))
}

// sessionEndCause names why a session ended, for the metrics.
func sessionEndCause(cause error) string {
	switch {
	case errors.Is(cause, lease.ErrLost):
		return "lease_lost"
	case errors.Is(cause, errIdle):
		return "idle"
	case errors.Is(cause, errReconnected):
		return "reconnected"
	case errors.Is(cause, lease.ErrGiveBack):
		return "give_back"
	case errors.Is(cause, errSessionPanic):
		return "panic"
	case errors.Is(cause, shared.ErrConsumerGone):
		return "consumer_gone"
	case cause == nil || errors.Is(cause, context.Canceled):
		return "stop"
	}
	return "error"
}

// backlogPoll is how often the owner asks the server about a lane above
// one with a waiting job.
const backlogPoll = 250 * time.Millisecond

// watchBacklog tells the scheduler whether the lanes above the lowest one
// with a waiting job have jobs not yet acknowledged on the server (their
// consumers' NumPending and NumAckPending, or for a closed lane the jobs on
// its subject), until ctx ends. Their handlers
// alone do not tell: under load a lane's handlers can all be done while its
// next jobs are on their way, and lower jobs got tokens then (low ones with
// normal work queued, normal ones while a high task ran). A lane nobody
// below waits for is not asked about, and after two polls its answer counts
// as unknown, which holds the lanes below back until it is asked again: one
// request per backlogPoll for an account busy in one lane, none (and no
// wakeup) for an idle one.
func watchBacklog(ctx context.Context, sched *scheduler, lanes *sessionLanes) {
	sched.mu.Lock()
	sched.watched = true
	sched.mu.Unlock()
	t := time.NewTicker(backlogPoll / 10)
	defer t.Stop()
	var asked [laneLow]time.Time
	for {
		if sched.lowestWaiting() == 0 && asked == [laneLow]time.Time{} {
			// Nothing below the high lane waits and no answer is to
			// expire: sleep until a lower job asks for a turn, so an idle
			// account costs no wakeups.
			t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-sched.lowerAsked:
			}
			t.Reset(backlogPoll / 10)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		below := sched.lowestWaiting()
		for lane := range laneLow {
			if lane >= below {
				// Nobody below waits: an answer older than two polls no
				// longer counts.
				if !asked[lane].IsZero() && time.Since(asked[lane]) > 2*backlogPoll {
					sched.setBacklog(lane, true)
					asked[lane] = time.Time{}
				}
				continue
			}
			if time.Since(asked[lane]) < backlogPoll {
				continue
			}
			asked[lane] = time.Now()
			asOf := sched.beganSoFar(lane)
			if queued, err := lanes.queued(ctx, lane); err == nil {
				sched.setBacklogAsOf(lane, queued, asOf)
			}
		}
		// Only a closed high lane above the waiting jobs: its answer comes
		// from the lane finder's look, new every backlogPoll, so looking
		// more often only costs wakeups (40,000 a second at 1,000
		// accounts).
		if below == laneNormal && !lanes.isOpen(laneHigh) {
			t.Reset(backlogPoll)
		} else {
			t.Reset(backlogPoll / 10)
		}
	}
}

// recheckMark is a lane consumer's metadata key naming the last JOBS
// sequence when it was made: the jobs up to it were queued before it and
// may have been delivered, even sent, by a consumer it replaced (one a
// server restart lost, the server keeping their state in memory); the
// later ones only it has delivered, so a first delivery of one is fresh.
// The mark lives and dies with the consumer's state, so whichever replica
// consumes the lane next reads what its maker knew.
const recheckMark = "broadcast.recheck_through"

// laneConsumer creates the consumer of one lane, or updates the one there,
// with metadata meta (the normal lane's closed marks, lanes.go) and its
// recheck mark, retrying until it works or ctx ends (then it returns nil).
// recheckThrough is the mark: the jobs up to it are checked for an earlier
// send. knownThrough, when not nil, is the mark of a consumer made anew
// instead of JOBS's last sequence: the session knows no job after it was
// delivered (the asleep mark's sequence, idle.go).
func (r *accountRunner) laneConsumer(ctx context.Context, a *contract.Account, p contract.Priority, meta map[string]string, knownThrough *uint64) (cons jetstream.Consumer, recheckThrough uint64) {
	cfg := consumerConfig(a, p)
	for {
		cons, recheckThrough, err := r.makeLaneConsumer(ctx, cfg, meta, knownThrough)
		if err == nil {
			return cons, recheckThrough
		}
		if ctx.Err() == nil && (errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDoesNotExist) ||
			errors.Is(err, jetstream.ErrConsumerExists)) {
			continue // deleted or made by another replica meanwhile
		}
		if r.replaceOldConsumer(ctx, cfg) {
			continue
		}
		r.log.Warn("cannot create account consumer; retrying", "priority", p, "err", err)
		select {
		case <-ctx.Done():
			return nil, 0
		case <-time.After(time.Second):
		}
	}
}

// makeLaneConsumer is one try of laneConsumer. A consumer made anew is
// marked with the stream's last sequence, read before it is made (the
// jobs stored after that read were delivered by nobody else); one found
// keeps its mark, and one found without a mark (made by an earlier
// version) is as unknown as one made now.
func (r *accountRunner) makeLaneConsumer(ctx context.Context, cfg jetstream.ConsumerConfig, meta map[string]string, knownThrough *uint64) (jetstream.Consumer, uint64, error) {
	withMark := func(through uint64) {
		cfg.Metadata = maps.Clone(meta)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[recheckMark] = strconv.FormatUint(through, 10)
	}
	var through uint64
	if knownThrough != nil {
		through = *knownThrough
	} else {
		var err error
		if through, err = r.jobsLastSeq(ctx); err != nil {
			return nil, 0, err
		}
	}
	withMark(through)
	cons, err := r.svc.js.CreateConsumer(ctx, contract.StreamJobs, cfg)
	if !errors.Is(err, jetstream.ErrConsumerExists) {
		return cons, through, err
	}
	found, err := r.svc.js.Consumer(ctx, contract.StreamJobs, cfg.Durable)
	if err != nil {
		return nil, 0, err
	}
	if marked, err := strconv.ParseUint(found.CachedInfo().Config.Metadata[recheckMark], 10, 64); err == nil {
		through = marked
	}
	withMark(through)
	cons, err = r.svc.js.UpdateConsumer(ctx, contract.StreamJobs, cfg)
	return cons, through, err
}

// jobsLastSeq is JOBS's last sequence.
func (r *accountRunner) jobsLastSeq(ctx context.Context) (uint64, error) {
	st, err := r.svc.js.Stream(ctx, contract.StreamJobs)
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().State.LastSeq, nil
}

// replaceOldConsumer deletes the account's consumer as earlier versions
// made it (pinned and for every priority before the lanes, with its state
// in a file before memory), when the server refuses to update it in place.
// The jobs stay in the stream: the new consumer delivers them, checking
// each for an earlier send (recheckMark). It reports whether it
// deleted one.
func (r *accountRunner) replaceOldConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) bool {
	cons, err := r.svc.js.Consumer(ctx, contract.StreamJobs, cfg.Durable)
	if err != nil {
		return false
	}
	old := cons.CachedInfo().Config
	if old.FilterSubject == cfg.FilterSubject && old.PriorityPolicy == jetstream.PriorityPolicyNone && old.MemoryStorage == cfg.MemoryStorage {
		return false
	}
	if err := r.svc.js.DeleteConsumer(ctx, contract.StreamJobs, cfg.Durable); err != nil {
		return false
	}
	r.log.Info("replaced the account's consumer of an earlier version", "old_filter", old.FilterSubject)
	return true
}

// stop ends the runner and waits for its in-flight sends.
func (r *accountRunner) stop() {
	r.cancel()
	<-r.stopped
	_, s := r.current()
	closeSender(s)
}
