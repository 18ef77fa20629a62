package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/shared"
)

// A session's lanes: the normal lane's consumer exists for the whole
// session; the high and low lanes' exist only while they have jobs. Every
// consumer of JOBS costs the server on every acknowledgement of the stream
// (it checks each one for interest in the message), so an account that
// never sends high or low work keeps one consumer instead of three: at
// 1,000 accounts the same task ran 4.4 times as fast.
//
// A lane closes after laneIdleClose without a job: its consume loop stops
// (its handlers finish), and once its subject holds no job, which in a
// work queue means every job of it was acknowledged, its consumer is
// deleted and a mark put on the normal lane's consumer (its metadata,
// closedMark). The mark says that the lane had no consumer and no job when
// it was set and that no consumer of it was made since, so the jobs a
// lane created again finds were never delivered and are handled as fresh.
// It is taken down before the lane is created again; and it lives and dies
// with the normal lane's state, which the server keeps in memory, so after
// a server restart (when a lost consumer may have handled jobs) there is
// none and the jobs found are checked for an earlier send
// (recheckMark), as before.
//
// A closed lane opens when the server shows jobs on its subject: the
// backlog watch asks for the high lane while lower jobs wait, and the
// service's lane finder (findLanes) looks at the high and low subjects of
// every account once a second.
type sessionLanes struct {
	r     *accountRunner
	a     *contract.Account
	sched *scheduler
	ctx   context.Context // the session
	end   context.CancelCauseFunc
	// valid reports whether the session's lease is still valid: a lane is
	// deleted or marked only then, so a holder that stalled past its lease
	// never deletes the consumer its successor consumes.
	valid func() bool

	// Opened and closed by keep's goroutine only; read under mu.
	mu     sync.Mutex
	open   [numLanes]*openLane // nil: closed (high and low only)
	marked map[contract.Priority]bool
	// freshThrough is the JOBS sequence up to which a lane marked closed
	// still checks its jobs for an earlier send: the asleep mark's when
	// the session began with one (idle.go), else 0.
	freshThrough uint64
	// normalMark is the recheck mark of the normal lane's consumer
	// (laneConsumer), which every update of its marks keeps.
	normalMark string
	loops      sync.WaitGroup
	wanted     chan int // lanes the server showed jobs for
}

// openLane is an open lane's consumer and its consume loop.
type openLane struct {
	cons jetstream.Consumer
	// recheckThrough is the consumer's: jobs queued before it was created
	// anew (recheckMark), kept when its loop starts again.
	recheckThrough uint64
	stop           context.CancelFunc
	done           chan struct{} // closed when the loop returned
	// idleSince and idleBegan are when the lane was first seen idle and
	// its began count then; zero while it is busy.
	idleSince time.Time
	idleBegan uint64
}

// laneIdleClose is how long a high or low lane stays open without a job
// (a variable for the tests).
var laneIdleClose = 10 * time.Second

// laneFindEvery is how often the lane finder looks for jobs of closed low
// lanes (closed high lanes: every backlogPoll).
const laneFindEvery = time.Second

// closedMark is the normal lane's metadata key marking lane p closed.
func closedMark(p contract.Priority) string { return "broadcast.closed." + string(p) }

func newSessionLanes(ctx context.Context, end context.CancelCauseFunc, valid func() bool, r *accountRunner, a *contract.Account, sched *scheduler) *sessionLanes {
	return &sessionLanes{r: r, a: a, sched: sched, ctx: ctx, end: end, valid: valid, marked: map[contract.Priority]bool{}, wanted: make(chan int, numLanes)}
}

// start opens the normal lane, and the high and low lanes that have a
// consumer or jobs; it marks the others closed, on the normal lane's
// consumer as it is created or updated. It returns false when the session
// ended first.
func (sl *sessionLanes) start() bool {
	r := sl.r
	// The marks an earlier session left on the normal lane: the other
	// lanes closed, and the normal lane's own (idle.go), which says the
	// session before ended with nothing pending, so the jobs queued since
	// are fresh to this consumer.
	// Or the asleep mark (idle.go), taken down first: the account slept
	// with no consumer, so the jobs queued after the sequence it names are
	// fresh on every lane.
	mark, err := r.takeAsleepMark(sl.ctx)
	if err != nil {
		sl.end(fmt.Errorf("taking down the asleep mark: %w", err))
		return false
	}
	asleepThrough, asleep := mark.through, mark.marked
	if sl.resumeKept(mark) {
		return sl.ctx.Err() == nil
	}
	normalIdle := false
	var c jetstream.Consumer
	if mark.noConsumer {
		err = jetstream.ErrConsumerNotFound
	} else {
		c, err = r.svc.js.Consumer(sl.ctx, contract.StreamJobs, contract.DispatchConsumer(sl.a.Name, contract.PriorityNormal))
	}
	// Slept: the account has no consumer at all. sleepDeeply saw no high
	// or low one before it left the mark, and every session takes the mark
	// down before it makes one; no job after the mark's sequence was ever
	// delivered.
	slept := asleep && errors.Is(err, jetstream.ErrConsumerNotFound)
	switch {
	case err == nil:
		for _, p := range []contract.Priority{contract.PriorityHigh, contract.PriorityLow} {
			sl.marked[p] = c.CachedInfo().Config.Metadata[closedMark(p)] != ""
		}
		normalIdle = c.CachedInfo().Config.Metadata[closedMark(contract.PriorityNormal)] != ""
	case slept:
		normalIdle, sl.freshThrough = true, asleepThrough
		sl.marked[contract.PriorityHigh], sl.marked[contract.PriorityLow] = true, true
	}
	existed := map[int]bool{}
	var toOpen []int
	for _, lane := range []int{laneHigh, laneLow} {
		if slept {
			continue
		}
		p := lanePriority[lane]
		_, err := r.svc.js.Consumer(sl.ctx, contract.StreamJobs, contract.DispatchConsumer(sl.a.Name, p))
		switch {
		case err == nil:
			// Left by an earlier session: it may hold jobs in flight. A
			// mark beside a consumer proves nothing; it goes.
			sl.marked[p], existed[lane] = false, true
			toOpen = append(toOpen, lane)
		case sl.marked[p]:
		default:
			// No consumer and no mark: a lane with no job can be marked
			// closed now, since none of its jobs can have been delivered.
			if empty, err := sl.subjectEmpty(lane); err == nil && empty {
				sl.marked[p] = true
			} else {
				toOpen = append(toOpen, lane)
			}
		}
	}
	var knownThrough *uint64
	if slept && asleepThrough != math.MaxUint64 { // not a mark that could not be read
		knownThrough = &asleepThrough
	}
	cons, recheckThrough := r.laneConsumer(sl.ctx, sl.a, contract.PriorityNormal, sl.marks(), knownThrough)
	if cons == nil {
		return false
	}
	sl.normalMark = strconv.FormatUint(recheckThrough, 10)
	if normalIdle {
		recheckThrough = min(recheckThrough, sl.freshThrough)
	}
	sl.run(laneNormal, cons, recheckThrough)
	r.log.Debug("lane opened", "priority", contract.PriorityNormal, "fresh", normalIdle, "recheck_through", recheckThrough)
	for _, lane := range toOpen {
		sl.openLane(lane, existed[lane])
	}
	return sl.ctx.Err() == nil
}

// resumeKept consumes the normal lane's consumer the runner kept when it
// last slept (idle.go), reporting whether it did. No session ran since
// (the runner took its own mark down), so the consumer is as the runner
// left it: nothing pending, the high and low lanes without a consumer, the
// jobs after the mark's sequence never delivered. Its metadata stays as
// it is (the normal lane's idle mark too, until the session next writes
// the marks: that mark only spares checks of jobs queued before the
// consumer was made, and it delivered them all before it slept). Its
// configuration is the account's: an edit that would change it
// (canUpdateInPlace) starts a new runner, which has no note. A server
// that lost it ends the session (run), and the next one makes it anew.
func (sl *sessionLanes) resumeKept(mark asleepMark) bool {
	c := mark.kept
	if c == nil {
		return false
	}
	info := c.CachedInfo().Config
	sl.marked[contract.PriorityHigh], sl.marked[contract.PriorityLow] = true, true
	sl.freshThrough = mark.through
	sl.normalMark = info.Metadata[recheckMark]
	recheckThrough := mark.through
	if m, err := strconv.ParseUint(sl.normalMark, 10, 64); err == nil {
		recheckThrough = min(recheckThrough, m)
	}
	sl.run(laneNormal, c, recheckThrough)
	sl.r.log.Debug("lane resumed", "priority", contract.PriorityNormal, "recheck_through", recheckThrough)
	return true
}

// marks is the normal lane's metadata for the lanes marked closed.
func (sl *sessionLanes) marks() map[string]string {
	meta := map[string]string{}
	for p, on := range sl.marked {
		if on {
			meta[closedMark(p)] = "true"
		}
	}
	if sl.normalMark != "" {
		meta[recheckMark] = sl.normalMark
	}
	return meta
}

// keep opens the lanes the server shows jobs for and closes idle ones,
// until the session ends.
func (sl *sessionLanes) keep() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-sl.ctx.Done():
			return
		case lane := <-sl.wanted:
			sl.openLane(lane, false)
		case <-t.C:
			for _, lane := range []int{laneHigh, laneLow} {
				sl.closeIfIdle(lane)
			}
		}
	}
}

// want asks keep to open lane, which the server showed jobs for.
func (sl *sessionLanes) want(lane int) {
	if sl.isOpen(lane) {
		return
	}
	select {
	case sl.wanted <- lane:
	default:
	}
}

func (sl *sessionLanes) isOpen(lane int) bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.open[lane] != nil
}

func (sl *sessionLanes) consumer(lane int) jetstream.Consumer {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if ol := sl.open[lane]; ol != nil {
		return ol.cons
	}
	return nil
}

// openLane creates a closed lane's consumer, or takes over the one an
// earlier session left (existed), and starts consuming it.
func (sl *sessionLanes) openLane(lane int, existed bool) {
	if sl.isOpen(lane) || sl.ctx.Err() != nil {
		return
	}
	p := lanePriority[lane]
	fresh := false
	if sl.marked[p] {
		// Down before the consumer exists: a mark must never outlive a
		// consumer that may have handled jobs.
		if err := sl.setMark(p, false); err != nil {
			sl.r.log.Warn("cannot open a lane: its closed mark stays; retrying", "priority", p, "err", err)
			return // the finder or the backlog watch asks again
		}
		fresh = !existed // a mark beside a consumer proves nothing
	}
	cons, recheckThrough := sl.r.laneConsumer(sl.ctx, sl.a, p, nil, nil)
	if cons == nil {
		return
	}
	if fresh {
		recheckThrough = min(recheckThrough, sl.freshThrough)
	}
	sl.run(lane, cons, recheckThrough)
	sl.r.log.Debug("lane opened", "priority", p, "fresh", fresh, "recheck_through", recheckThrough)
}

// run starts the consume loop of lane. A loop that fails ends the session,
// as does a consumer gone from the server (its state was in memory: the
// next session creates it again).
func (sl *sessionLanes) run(lane int, cons jetstream.Consumer, recheckThrough uint64) {
	r, a, p := sl.r, sl.a, lanePriority[lane]
	lctx, stop := context.WithCancel(sl.ctx)
	ol := &openLane{cons: cons, recheckThrough: recheckThrough, stop: stop, done: make(chan struct{})}
	sl.mu.Lock()
	sl.open[lane] = ol
	sl.mu.Unlock()
	// The lane's job groups hold at most groupJobsWaiting jobs before
	// their turns (jobgroup.go).
	jobs := make(chan struct{}, groupJobsWaiting(a, p))
	sl.loops.Go(r.guard(sl.end, "account consumer", func() {
		defer close(ol.done)
		err := shared.Consume(lctx, cons, func(ctx context.Context, msg jetstream.Msg) error {
			return r.handle(ctx, sl.sched, lane, recheckThrough, jobs, msg)
		}, shared.ConsumeConfig{
			Concurrency: jobsInFlight(a, p),
			AckWait:     ackWait,
			RetryDelay:  r.svc.cfg.BackoffBase,
			DeadLetter:  r.svc.deadLetter,
			LeftAtStop:  r.leftAtStop(recheckThrough),
			Logger:      r.log.With("priority", p),
		})
		switch {
		case errors.Is(err, shared.ErrConsumerGone):
			r.log.Warn("the lane's consumer is gone (the server restarted?); creating it again", "priority", p)
			sl.end(err)
		case err != nil:
			r.log.Error("account consumer stopped", "priority", p, "err", err)
			sl.end(err)
		}
	}))
}

// closeIfIdle closes lane after laneIdleClose without a job in its
// handlers and none in its subject: it stops the consume loop and, when
// the subject still holds no job, deletes the consumer and marks the lane
// closed. Otherwise the loop starts again.
func (sl *sessionLanes) closeIfIdle(lane int) {
	sl.mu.Lock()
	ol := sl.open[lane]
	sl.mu.Unlock()
	if ol == nil {
		return
	}
	idle, began := sl.sched.laneIdle(lane)
	switch {
	case !idle || ol.idleSince.IsZero() || began != ol.idleBegan:
		ol.idleSince, ol.idleBegan = time.Time{}, 0
		if idle {
			ol.idleSince, ol.idleBegan = time.Now(), began
		}
		return
	case time.Since(ol.idleSince) < laneIdleClose:
		return
	}
	if empty, err := sl.subjectEmpty(lane); err != nil || !empty {
		// Jobs wait on the server (a retry's delay): idle here, not empty.
		ol.idleSince = time.Time{}
		return
	}
	p := lanePriority[lane]
	ol.stop()
	<-ol.done
	if sl.ctx.Err() != nil {
		return
	}
	if empty, err := sl.subjectEmpty(lane); err != nil || !empty || !sl.valid() {
		sl.run(lane, ol.cons, ol.recheckThrough) // jobs arrived meanwhile: keep consuming
		return
	}
	if err := sl.r.svc.js.DeleteConsumer(sl.ctx, contract.StreamJobs, contract.DispatchConsumer(sl.a.Name, p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		sl.r.log.Debug("cannot delete an idle lane's consumer; keeping it", "priority", p, "err", err)
		sl.run(lane, ol.cons, ol.recheckThrough)
		return
	}
	sl.mu.Lock()
	sl.open[lane] = nil
	sl.mu.Unlock()
	if lane == laneHigh {
		sl.sched.setBacklog(lane, false)
	}
	// Without the mark (it could not be written) the lane's next jobs are
	// checked for an earlier send when it opens again: slower, still exact.
	if err := sl.setMark(p, true); err != nil {
		sl.r.log.Debug("cannot mark a closed lane", "priority", p, "err", err)
	}
	sl.r.log.Debug("idle lane closed", "priority", p)
}

// setMark puts the closed mark of p on the normal lane's consumer, or takes
// it down. It updates the consumer only if it exists: creating it here
// would hide from the running session that a server restart lost it.
func (sl *sessionLanes) setMark(p contract.Priority, closed bool) error {
	if closed && !sl.valid() {
		return lease.ErrLost
	}
	was := sl.marked[p]
	sl.marked[p] = closed
	cfg := consumerConfig(sl.a, contract.PriorityNormal)
	cfg.Metadata = sl.marks()
	if _, err := sl.r.svc.js.UpdateConsumer(sl.ctx, contract.StreamJobs, cfg); err != nil {
		sl.marked[p] = was
		return err
	}
	return nil
}

// subjectEmpty reports whether no job of lane's subject is in JOBS: in a
// work queue, that every one was acknowledged.
func (sl *sessionLanes) subjectEmpty(lane int) (bool, error) {
	_, err := sl.r.svc.jobs.GetLastMsgForSubject(sl.ctx, contract.JobSubject(sl.a.Name, lanePriority[lane]))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	return false, err
}

// queued reports whether lane has jobs not yet acknowledged on the server:
// its consumer's pending and unacknowledged jobs when open; when closed,
// whether the lane finder's latest look saw jobs on its subject (then it
// asks to open). One request per replica instead of one per account: at
// 1,000 accounts sending normal work, asking each about its high lane
// every backlogPoll was 4,000 requests a second.
func (sl *sessionLanes) queued(ctx context.Context, lane int) (bool, error) {
	if c := sl.consumer(lane); c != nil {
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.NumPending+uint64(info.NumAckPending) > 0, nil
	}
	seen := sl.r.svc.laneJobs[lane].Load()
	if seen == nil || time.Since(seen.at) > 2*backlogPoll {
		return false, errNotLookedYet
	}
	if seen.accounts[sl.a.Name] {
		sl.want(lane)
		return true, nil
	}
	return false, nil
}

// errNotLookedYet is queued's answer for a closed lane the finder has not
// looked at lately: unknown, so the lanes below keep waiting.
var errNotLookedYet = errors.New("the lane finder has not looked lately")

// laneLook is what the lane finder saw: the accounts with jobs on a lane's
// subject, at a time.
type laneLook struct {
	at       time.Time
	accounts map[string]bool
}

// wait waits for every consume loop of the session to return; call after
// the session ended and keep returned.
func (sl *sessionLanes) wait() { sl.loops.Wait() }

// findLanes looks, every backlogPoll for the high and normal lanes and
// every laneFindEvery for the low one, at the subjects of the lanes closed
// in this replica's sessions or of its sleeping runners (idle.go), across
// every account in one request, asks the sessions whose lanes have jobs to
// open them and wakes the sleeping runners that have jobs. The backlog
// watch reads the high lane's look (queued).
func (s *Service) findLanes(ctx context.Context) {
	t := time.NewTicker(backlogPoll)
	defer t.Stop()
	lowEvery := int(laneFindEvery / backlogPoll)
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		asleep := s.anyAsleep()
		for _, lane := range []int{laneHigh, laneNormal, laneLow} {
			if lane == laneLow && tick%lowEvery != 0 {
				continue
			}
			if !asleep && (lane == laneNormal || !s.anyLaneClosed(lane)) {
				continue
			}
			at := time.Now()
			info, err := s.jobs.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectJobsPrefix+"*."+string(lanePriority[lane])))
			if err != nil {
				s.log.Debug("lane finder: stream info", "err", err)
				continue
			}
			look := &laneLook{at: at, accounts: map[string]bool{}}
			for subject := range info.State.Subjects {
				account, _, _ := strings.Cut(strings.TrimPrefix(subject, contract.SubjectJobsPrefix), ".")
				look.accounts[account] = true
			}
			s.laneJobs[lane].Store(look)
			for account := range look.accounts {
				s.mu.Lock()
				r := s.runners[account]
				s.mu.Unlock()
				if r == nil {
					continue
				}
				if sl := r.lanes.Load(); sl != nil {
					sl.want(lane)
				} else {
					r.nudge()
				}
			}
		}
	}
}

// anyAsleep reports whether a runner of this replica has no session.
func (s *Service) anyAsleep() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runners {
		if r.asleep() {
			return true
		}
	}
	return false
}

// anyLaneClosed reports whether a session of this replica has lane closed.
func (s *Service) anyLaneClosed(lane int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runners {
		if sl := r.lanes.Load(); sl != nil && !sl.isOpen(lane) {
			return true
		}
	}
	return false
}
