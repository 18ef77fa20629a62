package dispatch

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// An account without work holds no session: no lease to refresh, no pull
// request, no timers, and at most its normal lane's consumer on JOBS, kept
// within a budget (below). Its runner sleeps until the lane finder
// (findLanes, one request per lane for every account of the replica) shows
// jobs on one of its subjects, then takes the lease and sends; a session
// with nothing to do for Config.SessionIdle ends and releases the lease.
//
// The ending session marks the normal lane idle (closedMark(normal)), and
// once its loops have stopped, with nothing pending on the consumer, no
// job on any of the account's subjects and no high or low consumer, leaves
// the asleep mark in KV broadcast_lanes (sleepDeeply). The mark names the
// last JOBS sequence before it: a job after it was never delivered, and
// one at or before it can only be a job acknowledged before the mark that
// a server crash brought back, so it is checked for an earlier send
// (recheckThrough). Every session takes the mark down before it creates
// or consumes any lane (takeAsleepMark).
//
// The normal lane's consumer stays while fewer than Config.KeptConsumers
// of this replica's sleeping accounts keep theirs; beyond that it is
// deleted. Waking is then the lease and the mark: the runner takes the
// mark down by the revision it left, which proves no session anywhere ran
// since, so the consumer it kept is as it left it (nothing pending, high
// and low lanes closed) and it consumes it again without asking the server
// anything (1,000 accounts asleep when a task comes, with wake notices:
// 0.72 of the rate of 3 accounts making their consumers, 0.83 keeping
// them; docs/performance.md).
// The price: every consumer of JOBS costs the server on every
// acknowledgement of the stream (it asks each whether it still needs the
// message), idle or not, about 0.14 µs a consumer per JOBS message (a
// message carries up to 24 jobs), which the budget bounds. A kept
// consumer the server lost (a restart: its state is in memory) ends the
// session that finds it gone, and the next one makes it anew, checking
// the queued jobs for earlier sends. Where a consumer cannot be deleted it
// stays, and the next session, finding it, goes by the consumer's own
// state and idle mark.
//
// An account never set up (neither its normal lane's consumer nor the
// asleep mark) has one session anyway, which leaves one of them.

// Render names the accounts of a batch's jobs before it stores them
// (contract.SubjectWake): a sleeping runner named starts its session then,
// wanting its lease for wakeNoticeFor even while the lane finder shows no
// job yet, so it is consuming when the jobs are stored (1,000 accounts
// asleep first, consumers kept: 0.75 of the rate of 3 accounts on the
// finder's look alone, 0.83 with the notices). A notice whose jobs never
// come costs a session that idles out.
const wakeNoticeFor = 5 * time.Second

// onWakeNotice wakes the sleeping runners a wake notice names.
func (s *Service) onWakeNotice(m *nats.Msg) {
	until := time.Now().Add(wakeNoticeFor).UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	contract.WakeNoticeAccounts(m.Data, func(account string) {
		if r := s.runners[account]; r != nil && r.asleep() {
			r.expectedUntil.Store(until)
			r.nudge()
		}
	})
}

// expected reports whether a wake notice named the account lately.
func (r *accountRunner) expected() bool { return time.Now().UnixNano() < r.expectedUntil.Load() }

// errIdle ends a session that had nothing to do for Config.SessionIdle.
var errIdle = errors.New("no work for a while")

// nudge wakes a sleeping runner: the lane finder saw jobs for it.
func (r *accountRunner) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// waitForWork sleeps until the finder shows jobs for the account; it
// returns false when the runner stops first.
func (r *accountRunner) waitForWork(ctx context.Context) bool {
	for {
		has, known := r.svc.hasJobs(r.name)
		if has {
			return true
		}
		var poll <-chan time.Time
		if !known {
			poll = time.After(backlogPoll) // the finder has not looked yet
		}
		select {
		case <-ctx.Done():
			return false
		case <-r.wake:
			return true
		case <-poll:
		}
	}
}

// hasJobs reports whether the lane finder's latest looks show jobs for the
// account on any lane; known is false when a look is missing or too old
// to say.
func (s *Service) hasJobs(account string) (has, known bool) {
	known = true
	for lane := range numLanes {
		look := s.laneJobs[lane].Load()
		if look == nil || time.Since(look.at) > 2*laneFindEvery+backlogPoll {
			known = false
			continue
		}
		if look.accounts[account] {
			return true, true
		}
	}
	return false, known
}

// asleep reports whether the runner has no session.
func (r *accountRunner) asleep() bool { return r.lanes.Load() == nil && !r.inSession.Load() }

// endWhenIdle ends the session once every lane has been without a job in
// its handlers for Config.SessionIdle, the high and low lanes are closed,
// and the normal lane's consumer has nothing pending or unacknowledged on
// the server and its subject no job.
func (r *accountRunner) endWhenIdle(ctx context.Context, end context.CancelCauseFunc, sched *scheduler, lanes *sessionLanes) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var idleSince time.Time
	var idleBegan [numLanes]uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		idle, began := true, [numLanes]uint64{}
		for lane := range numLanes {
			var b uint64
			var ok bool
			if ok, b = sched.laneIdle(lane); !ok {
				idle = false
			}
			began[lane] = b
		}
		if !idle || lanes.isOpen(laneHigh) || lanes.isOpen(laneLow) || idleSince.IsZero() || began != idleBegan {
			idleSince, idleBegan = time.Time{}, began
			if idle {
				idleSince = time.Now()
			}
			continue
		}
		if time.Since(idleSince) < r.svc.cfg.SessionIdle {
			continue
		}
		if queued, err := lanes.queued(ctx, laneNormal); err != nil || queued {
			idleSince = time.Time{}
			continue
		}
		if empty, err := lanes.subjectEmpty(laneNormal); err != nil || !empty {
			idleSince = time.Time{} // a job waits on the server (a retry's delay)
			continue
		}
		// The mark lets the next session take the jobs queued meanwhile as
		// fresh; without it (not written) they are checked for an earlier
		// send: slower, still exact.
		if err := lanes.setMark(contract.PriorityNormal, true); err != nil {
			r.log.Debug("cannot mark the idle normal lane", "err", err)
		}
		end(errIdle)
		return
	}
}

// acquireWhileWanted is acquire for as long as the account has work, a
// wake notice says its jobs are coming (or always, when must): it returns
// false when the runner stops or the finder shows no more jobs for it
// (another replica did them).
func (r *accountRunner) acquireWhileWanted(ctx context.Context, l *lease.Lease, must bool) bool {
	wanted := func() bool {
		has, known := r.svc.hasJobs(r.name)
		return must || has || !known || r.expected()
	}
	// A waking account mostly finds its lease free: one try before the
	// watch, which costs the server a consumer made and deleted (a
	// thousand of each when a task wakes 1,000 accounts).
	if !wanted() {
		return false
	}
	if ok, _ := r.tryAcquire(ctx, l); ok {
		return true
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changed := r.watchLease(wctx)
	return r.acquire(wctx, l, changed, wanted)
}

// setUp reports whether the account's normal lane has its consumer on
// the server or the account sleeps with its asleep mark (an error counts
// as no: a session finds out).
func (r *accountRunner) setUp(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	if _, err := r.svc.js.Consumer(cctx, contract.StreamJobs, contract.DispatchConsumer(r.name, contract.PriorityNormal)); err == nil {
		return true
	}
	_, err := r.svc.asleepKV.Get(cctx, r.name)
	return err == nil
}

// sleepDeeply leaves the asleep mark of an account whose session ended
// idle and deletes its normal lane's consumer, while l holds: only when
// the consumer has nothing pending or unacknowledged, the high and low
// lanes have no consumer and none of the three subjects holds a job. Any
// doubt leaves the consumer as it is.
func (r *accountRunner) sleepDeeply(ctx context.Context, l *lease.Lease) {
	ctx, cancel := context.WithTimeout(ctx, 2*lease.OpTimeout)
	defer cancel()
	js, name := r.svc.js, contract.DispatchConsumer(r.name, contract.PriorityNormal)
	st, err := r.svc.jobs.Info(ctx)
	if err != nil {
		return
	}
	through := st.State.LastSeq // read first: a job after it is one the checks below may miss
	c, err := js.Consumer(ctx, contract.StreamJobs, name)
	if err != nil {
		return
	}
	info, err := c.Info(ctx)
	if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
		return
	}
	for _, p := range []contract.Priority{contract.PriorityHigh, contract.PriorityLow} {
		if _, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(r.name, p)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return
		}
	}
	for _, p := range lanePriority {
		if _, err := r.svc.jobs.GetLastMsgForSubject(ctx, contract.JobSubject(r.name, p)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
	}
	if !l.Valid() {
		return
	}
	rev, err := r.svc.asleepKV.Put(ctx, r.name, []byte(strconv.FormatUint(through, 10)))
	if err != nil {
		r.log.Debug("cannot leave the asleep mark; the consumer stays", "err", err)
		return
	}
	note := &sleepNote{rev: rev, through: through}
	r.slept = note
	if r.svc.keepConsumer() {
		note.kept = c
		return
	}
	if err := js.DeleteConsumer(ctx, contract.StreamJobs, name); err != nil {
		r.log.Debug("cannot delete the sleeping account's consumer; it stays", "err", err)
	} else {
		note.noConsumer = true
	}
}

// keepConsumer reserves a place among the consumers sleeping accounts keep
// (Config.KeptConsumers), reporting whether there was one; forgetSlept
// gives it back.
func (s *Service) keepConsumer() bool {
	for {
		n := s.keptConsumers.Load()
		if n >= int64(s.cfg.KeptConsumers) { // negative: none
			return false
		}
		if s.keptConsumers.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// forgetSlept drops the runner's note of the mark it left, giving back
// the place of the consumer it kept.
func (r *accountRunner) forgetSlept() {
	if r.slept != nil && r.slept.kept != nil {
		r.svc.keptConsumers.Add(-1)
	}
	r.slept = nil
}

// sleepNote is what a runner knows of the asleep mark it left: the mark's
// revision and sequence, and whether it deleted the normal lane's consumer
// after leaving it or kept it (kept, as it was then). While the mark keeps
// that revision no session has taken it down, so none has made or
// consumed a consumer since (every session takes the mark down first):
// the next session of this runner takes it with one request instead of
// three, and consumes the kept consumer without looking it up.
type sleepNote struct {
	rev, through uint64
	noConsumer   bool
	kept         jetstream.Consumer
}

// asleepMark is what a session learns from taking the asleep mark down.
type asleepMark struct {
	// through is the JOBS sequence the mark names: jobs up to it are to
	// be checked for an earlier send (all of them when the mark cannot
	// be read); marked says there was a mark.
	through uint64
	marked  bool
	// noConsumer says the account is known to have no normal lane
	// consumer (this runner deleted it after leaving the mark); kept is
	// the one it kept instead. Otherwise the session asks.
	noConsumer bool
	kept       jetstream.Consumer
}

// takeAsleepMark takes the account's asleep mark down and says what it
// knows of it. A session calls it before it creates or consumes any lane:
// the mark must never stand beside a consumer that may be handling jobs.
func (r *accountRunner) takeAsleepMark(ctx context.Context) (asleepMark, error) {
	if note := r.slept; note != nil {
		r.forgetSlept()
		if r.svc.asleepKV.Delete(ctx, r.name, jetstream.LastRevision(note.rev)) == nil {
			return asleepMark{through: note.through, marked: true, noConsumer: note.noConsumer, kept: note.kept}, nil
		}
	}
	through, marked, err := r.readAsleepMark(ctx)
	return asleepMark{through: through, marked: marked}, err
}

// readAsleepMark is takeAsleepMark without the runner's note: it reads the
// mark, then takes down that revision.
func (r *accountRunner) readAsleepMark(ctx context.Context) (through uint64, marked bool, err error) {
	e, err := r.svc.asleepKV.Get(ctx, r.name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if err := r.svc.asleepKV.Delete(ctx, r.name, jetstream.LastRevision(e.Revision())); err != nil {
		return 0, false, err
	}
	through, perr := strconv.ParseUint(string(e.Value()), 10, 64)
	if perr != nil {
		through = math.MaxUint64
	}
	return through, true, nil
}
