package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// An account without work holds no session: no lease to refresh, no pull
// request on its consumers, no timers. Its runner sleeps until the lane
// finder (findLanes, one request per lane for every account of the
// replica) shows jobs on one of its subjects, then takes the lease and
// sends; a session with nothing to do for sessionIdleClose ends and
// releases the lease. The normal lane's consumer stays on the server
// between sessions (its delivery state and the closed marks live on it),
// and an idle durable consumer costs the server nothing but its memory.
// The ending session marks it idle (closedMark(normal)): nothing was
// pending when the session ended, so the jobs the next session finds were
// never delivered, or come back as redeliveries. The next session takes
// the mark down as it starts; after a server restart, which loses the
// consumer, there is none, and the jobs are checked for an earlier send. At 1,000
// accounts this is what keeps an idle replica near the cost of one.

// sessionIdleClose is how long a session stays without a job before it
// ends (a variable for the tests).
var sessionIdleClose = 10 * time.Second

// errIdle ends a session that had nothing to do for sessionIdleClose.
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
// its handlers for sessionIdleClose, the high and low lanes are closed,
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
		if time.Since(idleSince) < sessionIdleClose {
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

// acquireWhileWanted is acquire for as long as the account has work (or
// always, when must): it returns false when the runner stops or the
// finder shows no more jobs for it (another replica did them).
func (r *accountRunner) acquireWhileWanted(ctx context.Context, l *lease.Lease, must bool) bool {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changed := r.watchLease(wctx)
	return r.acquire(wctx, l, changed, func() bool {
		has, known := r.svc.hasJobs(r.name)
		return must || has || !known
	})
}

// normalLaneExists reports whether the account's normal lane has its
// consumer on the server (an error counts as no: a session finds out).
func (r *accountRunner) normalLaneExists(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	_, err := r.svc.js.Consumer(cctx, contract.StreamJobs, contract.DispatchConsumer(r.name, contract.PriorityNormal))
	return err == nil
}
