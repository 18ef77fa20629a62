package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// Lanes: an account's jobs arrive on three consumers, one per priority; a
// lane's index is its rank (0 is served first).
const (
	laneHigh = iota
	laneNormal
	laneLow
	numLanes
)

// laneOf returns the lane of a priority (unknown ones are normal).
func laneOf(p contract.Priority) int {
	switch p {
	case contract.PriorityHigh:
		return laneHigh
	case contract.PriorityLow:
		return laneLow
	}
	return laneNormal
}

// lanePriority is the priority a lane carries.
var lanePriority = [numLanes]contract.Priority{contract.PriorityHigh, contract.PriorityNormal, contract.PriorityLow}

// errSchedStopped means the owner's session ended (stop or lost lease)
// while a job waited for its turn.
var errSchedStopped = errors.New("account no longer sending from this process")

// scheduler hands an account's sends out across its lanes, strictly by
// priority: the next token of the account's pacer, and a free slot of its
// in-flight cap, go to a waiting high job before a normal one before a low
// one. A lower lane is served only while every higher lane is idle, that is
// has no job being handled outside its provider call: a higher lane's
// handlers busy with the ledger, events and acks between their sends still
// count as its work (counting only the jobs before their send, and handing
// a token taken meanwhile to any waiter, let 8 low jobs through while
// 98,000 normal ones were queued in the first run of
// TestDispatchPriorityOvertakes), but a job inside its
// provider call does not, so a slow provider does not stop the lower lanes
// while slots are free. A high task therefore takes the account's whole
// rate while it has work, and the total never exceeds the pacer's rate and
// burst, whatever the lanes.
//
// One scheduler serves one ownership session of a runner: its run loop
// stops, and every waiter is turned away, when the session ends.
type scheduler struct {
	pacer *pacer
	slots int // in-flight cap: at most this many granted, unreleased sends

	mu      sync.Mutex
	waiting [numLanes]waitLine // FIFO per lane
	busy    [numLanes]int      // tickets being handled outside their provider call
	// backlog marks the high and normal lanes while their consumers have
	// jobs not yet acknowledged on the server, or while that is not known
	// (setBacklog): the lanes below wait for them too.
	backlog [numLanes]bool
	// began counts the jobs each lane has begun: an "empty" answer asked
	// for before the latest began is stale (setBacklogAsOf).
	began [numLanes]uint64
	// live counts each lane's tickets not yet finished (laneIdle).
	live    [numLanes]int
	watched bool // watchBacklog runs for this session
	inUse   int  // granted slots not yet released
	// wanted is when a job of each lane last asked for a turn; a lane that
	// asked lately counts as waiting for watchBacklog even when its jobs
	// were served at once.
	wanted [numLanes]time.Time
	// valid reports whether the session may still send (run's argument).
	valid  func() bool
	grants uint64        // grants so far
	wake   chan struct{} // poked on every change that may allow a grant
	// lowerAsked is poked when a job below the high lane asks for a turn,
	// to wake an idle watchBacklog.
	lowerAsked chan struct{}
	done       chan struct{} // closed when the session ends
	endOnce    sync.Once
}

// ticket is one job's claim in its lane, from delivery to the end of its
// handling: counted as its lane's work except while it holds a slot (its
// provider call).
type ticket struct {
	s       *scheduler
	lane    int
	counted bool          // counted in busy
	held    bool          // holds a slot
	live    bool          // counted in live: not finished
	granted bool          // was granted (ready is closed)
	inLine  bool          // waiting in its lane's line (waitLine)
	listed  bool          // in its lane's line's slice, in line or not
	seq     uint64        // the grant's number in the session, from 1
	ready   chan struct{} // closed on grant
	// queued, when set, is called each time wait has queued the ticket
	// (or granted it at once), outside the lock.
	queued func()
}

func newScheduler(p *pacer, slots int) *scheduler {
	return &scheduler{pacer: p, slots: max(slots, 1), wake: make(chan struct{}, 1), lowerAsked: make(chan struct{}, 1),
		done: make(chan struct{})}
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// end stops the session: run returns and waiters are turned away.
func (s *scheduler) end() { s.endOnce.Do(func() { close(s.done) }) }

// ended reports whether the session stopped (end).
func (s *scheduler) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// begin counts a job of lane as its lane's work; call finish when its
// handling ends.
func (s *scheduler) begin(lane int) *ticket {
	s.mu.Lock()
	s.busy[lane]++
	s.began[lane]++
	s.live[lane]++
	// A job being handled is unacknowledged on the server: its lane has a
	// backlog now, whatever the last poll said (watchBacklog clears it once
	// the lane is empty). Between a high task's jobs a stale "empty" from
	// before the task let 11-13 normal sends through. Only while a watcher
	// runs: nobody else would clear it.
	if lane < laneLow && s.watched {
		s.backlog[lane] = true
	}
	s.mu.Unlock()
	return &ticket{s: s, lane: lane, counted: true, live: true, ready: make(chan struct{})}
}

// sent ends the provider call: the slot is free, and the job counts as its
// lane's work again until finish (its ledger entry, event and ack).
func (t *ticket) sent() {
	s := t.s
	s.mu.Lock()
	if t.held {
		t.held = false
		s.inUse--
		if !t.counted {
			t.counted = true
			s.busy[t.lane]++
		}
	}
	s.mu.Unlock()
	s.poke()
}

// finish ends the ticket: it is no longer counted as busy, and its slot, if
// held, is released. Calling it twice is safe.
func (t *ticket) finish() {
	s := t.s
	s.mu.Lock()
	changed := t.counted || t.held
	if t.live {
		t.live = false
		s.live[t.lane]--
	}
	if t.counted {
		t.counted = false
		s.busy[t.lane]--
	}
	if t.held {
		t.held = false
		s.inUse--
	}
	s.mu.Unlock()
	if changed {
		s.poke()
	}
}

// wait queues the ticket for a token and a slot, for at most maxWait. It
// returns true once granted (the caller then holds a slot until finish);
// false with a nil error when maxWait passed first (the ticket stays
// counted as busy, so the caller may check its job again and wait again);
// or an error when ctx ended or the session did.
func (t *ticket) wait(ctx context.Context, maxWait time.Duration) (bool, error) {
	s := t.s
	s.mu.Lock()
	if t.granted {
		s.mu.Unlock()
		return true, nil
	}
	s.wanted[t.lane] = time.Now()
	if t.lane > laneHigh {
		select {
		case s.lowerAsked <- struct{}{}:
		default:
		}
	}
	if s.grantNow(t) {
		s.mu.Unlock()
		if t.queued != nil {
			t.queued()
		}
		return true, nil
	}
	s.waiting[t.lane].join(t)
	s.mu.Unlock()
	if t.queued != nil {
		t.queued()
	}
	s.poke()
	timer := waitTimers.Get().(*time.Timer)
	timer.Reset(maxWait)
	defer func() {
		timer.Stop()
		waitTimers.Put(timer)
	}()
	var err error
	select {
	case <-t.ready:
		return true, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.done:
		err = errSchedStopped
	case <-timer.C:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.granted {
		return true, nil // granted at the same moment
	}
	s.waiting[t.lane].leave(t)
	return false, err
}

// waitTimers are the timers of waiting tickets, reused: one per job was a
// tenth of dispatch's allocations. (Since Go 1.23 a stopped or reset timer
// never delivers a stale tick.)
var waitTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// grantNow grants t at once when run would grant it next anyway: nobody
// waits ahead of it (in its lane or above), no lane above is busy or has
// jobs queued on the server, a slot is free, the lease holds and a token is
// there now. Without it, every send went through run's goroutine: two
// goroutine switches a job, 4% of the benchmark's CPU. Call with s.mu held.
func (s *scheduler) grantNow(t *ticket) bool {
	for up := range t.lane + 1 {
		if s.waiting[up].len() > 0 {
			return false
		}
		if up < t.lane && (s.busy[up] > 0 || s.backlog[up]) {
			return false
		}
	}
	if s.inUse >= s.slots || s.valid == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
	}
	if !s.valid() || !s.pacer.tryToken() {
		return false
	}
	t.held, t.granted = true, true
	s.grants++
	t.seq = s.grants
	if t.counted {
		t.counted = false
		s.busy[t.lane]--
	}
	s.inUse++
	close(t.ready)
	return true
}

// lowestWaiting returns the lowest-ranked lane with a waiting job, or one
// that asked for a turn within the last two backlog polls (0 when none, or
// only high, did): the lanes above it are those whose queues on the server
// matter (watchBacklog).
func (s *scheduler) lowestWaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for lane := numLanes - 1; lane > 0; lane-- {
		if s.waiting[lane].len() > 0 || time.Since(s.wanted[lane]) < 2*backlogPoll {
			return lane
		}
	}
	return 0
}

// setBacklog records whether lane has undelivered jobs on the server. The
// handlers alone do not tell: on a loaded host a lane's handlers can all be
// done while its next jobs are still on their way, and low jobs got tokens
// then with 98,000 normal jobs queued.
func (s *scheduler) setBacklog(lane int, queued bool) {
	s.mu.Lock()
	changed := s.backlog[lane] != queued
	s.backlog[lane] = queued
	s.mu.Unlock()
	if changed {
		s.poke()
	}
}

// laneIdle reports whether lane has no job in its handlers, with the
// number of jobs it has begun so far: a lane idle with the same count at
// two looks was idle in between.
func (s *scheduler) laneIdle(lane int) (idle bool, began uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[lane] == 0 && s.waiting[lane].len() == 0, s.began[lane]
}

// handling is how many of lane's jobs are being handled here (begun, not
// finished): delivered and not yet acknowledged.
func (s *scheduler) handling(lane int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[lane]
}

// beganSoFar returns how many jobs lane has begun: taken before asking the
// server, and given back to setBacklogAsOf with its answer.
func (s *scheduler) beganSoFar(lane int) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.began[lane]
}

// setBacklogAsOf records the server's answer to a question asked when lane
// had begun asOf jobs. An "empty" is dropped when a job began since: the
// server answered before that job reached it, or before its ack did not,
// and clearing the mark then let normal sends through between a high
// task's jobs.
func (s *scheduler) setBacklogAsOf(lane int, queued bool, asOf uint64) {
	s.mu.Lock()
	stale := !queued && s.began[lane] != asOf
	changed := !stale && s.backlog[lane] != queued
	if changed {
		s.backlog[lane] = queued
	}
	s.mu.Unlock()
	if changed {
		s.poke()
	}
}

// pick returns the lane whose first waiter is served next, or -1: the
// highest lane with a waiter, unless a higher lane is busy. Call with s.mu
// held.
func (s *scheduler) pick() int {
	for lane := range numLanes {
		if s.waiting[lane].len() > 0 {
			for up := range lane {
				if s.backlog[up] {
					return -1
				}
			}
			return lane
		}
		if s.busy[lane] > 0 {
			return -1
		}
	}
	return -1
}

// stillValid reports whether a granted send may still start: the
// session's lease is still valid (run's valid). A step between the grant
// and the call (the frequency reservation, a KV write; a pause in
// pacer.admit) can outlast the connection: a JetStream request made while
// it is down waits for the reconnect and succeeds then, when a standby
// that heard the holder gone may hold the lease already.
func (s *scheduler) stillValid() bool {
	s.mu.Lock()
	valid := s.valid
	s.mu.Unlock()
	return valid != nil && valid()
}

// run hands out tokens until the session ends. valid is checked after each
// token, before the grant: when it fails (the lease could not be confirmed)
// run ends the session and returns lease.ErrLost, and no further send starts.
func (s *scheduler) run(ctx context.Context, valid func() bool) error {
	defer s.end()
	s.mu.Lock()
	s.valid = valid
	s.mu.Unlock()
	token := false // a token taken, not yet given
	for {
		for !s.grantable() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.done:
				return errSchedStopped
			case <-s.wake:
			}
		}
		if !token {
			if err := s.pacer.token(ctx); err != nil {
				return err
			}
			token = true
		}
		if !valid() {
			return lease.ErrLost
		}
		token = !s.grant()
	}
}

// grantable reports whether a waiter may be served and a slot is free.
func (s *scheduler) grantable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse < s.slots && s.pick() >= 0
}

// grant gives the token just taken to the best waiter now (a high job that
// arrived while the token was awaited gets it). When a higher lane turned
// busy meanwhile without a waiter, the token is dropped rather than given
// to a lower lane: a token unused only lowers the rate. When a direct
// grant (grantNow) took the last slot meanwhile, the token is kept for the
// next free slot: it reports false then, true when the token is spent.
func (s *scheduler) grant() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inUse >= s.slots {
		return false
	}
	lane := s.pick()
	if lane < 0 {
		return true
	}
	t := s.waiting[lane].pop()
	t.held, t.granted = true, true
	s.grants++
	t.seq = s.grants
	if t.counted {
		t.counted = false
		s.busy[lane]--
	}
	s.inUse++
	close(t.ready)
	return true
}
