package dispatch

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/lease"
)

// schedGrant is one grant as a test lane saw it.
type schedGrant struct {
	lane int
	seq  uint64 // the scheduler's order of grants
	at   time.Time
}

// runLane handles n jobs of lane with k workers the way the consume loop
// and handle do (begin, wait for the turn, send taking hold, sent, a little
// bookkeeping, finish), recording every grant.
func runLane(ctx context.Context, s *scheduler, lane, n, k int, hold time.Duration, record func(schedGrant)) *sync.WaitGroup {
	jobs := make(chan int, n)
	for i := range n {
		jobs <- i
	}
	close(jobs)
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			for range jobs {
				t := s.begin(lane)
				for {
					ok, err := t.wait(ctx, 50*time.Millisecond)
					if ok {
						break
					}
					if err != nil {
						t.finish()
						return
					}
				}
				record(schedGrant{lane: lane, seq: t.seq, at: time.Now()})
				time.Sleep(hold)
				t.sent()
				time.Sleep(100 * time.Microsecond) // ledger, event, ack
				t.finish()
			}
		})
	}
	return &wg
}

// TestDispatchSchedulerStrictPriority: high work takes every token while
// it has some, normal waits meanwhile, low waits for normal, and the
// lanes together keep the rate. The orderings and the rate ceiling must
// hold in every run; the timings (high's first grant soon, its rate near
// the whole rate) in one of up to three runs, as a starved CPU delays
// the scheduler's wake-ups (a scheduler slow by design fails all three).
func TestDispatchSchedulerStrictPriority(t *testing.T) {
	t.Parallel()
	const rate, burst = 500, 2
	var timely bool
	for run := 1; run <= 3 && !timely; run++ {
		r := runStrictPriority(t, rate, burst)
		t.Logf("run %d: first high grant %s after its arrival; high %.0f/s; normal grants during high %d; low grants before the last normal %d; max %d grants in any second (rate %d, burst %d)",
			run, r.firstHighAfter.Round(time.Microsecond), r.highRate, r.normalDuringHigh, r.lowBeforeNormalDone, r.maxInSecond, rate, burst)
		require.Zero(t, r.normalDuringHigh, "normal waits while high has work")
		require.Zero(t, r.lowBeforeNormalDone, "low waits while normal has work")
		require.LessOrEqual(t, r.maxInSecond, rate+burst, "the lanes together keep rate+burst")
		timely = r.firstHighAfter < 50*time.Millisecond && r.highRate >= 0.9*rate
	}
	require.True(t, timely, "in one run of three, a high job gets one of the next tokens (< 50 ms) and high takes the whole rate (at least 90 percent)")
}

// strictPriorityRun is what one run of the strict-priority scenario saw.
type strictPriorityRun struct {
	firstHighAfter                        time.Duration
	highRate                              float64
	normalDuringHigh, lowBeforeNormalDone int
	maxInSecond                           int
}

// runStrictPriority runs 300 normal jobs, then 100 low, then 200 high,
// four workers a lane, through one scheduler.
func runStrictPriority(t *testing.T, rate, burst int) strictPriorityRun {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newScheduler(newPacer(float64(rate), float64(rate), burst), 4)
	go func() { _ = s.run(ctx, func() bool { return true }) }()

	var mu sync.Mutex
	var grants []schedGrant
	record := func(g schedGrant) { mu.Lock(); grants = append(grants, g); mu.Unlock() }

	normal := runLane(ctx, s, laneNormal, 300, 4, 0, record)
	time.Sleep(100 * time.Millisecond) // normal work is flowing
	low := runLane(ctx, s, laneLow, 100, 4, 0, record)
	time.Sleep(100 * time.Millisecond)
	highAt := time.Now()
	high := runLane(ctx, s, laneHigh, 200, 4, 0, record)
	for _, wg := range []*sync.WaitGroup{high, normal, low} {
		wg.Wait()
	}

	require.Len(t, grants, 600)
	// Orderings by the scheduler's grant numbers (the recorded times of
	// grants made moments apart may come out of order on a loaded CPU).
	var firstHigh, lastHigh time.Time
	var firstHighSeq, lastHighSeq, lastNormalSeq uint64
	for _, g := range grants {
		switch g.lane {
		case laneHigh:
			if firstHigh.IsZero() || g.at.Before(firstHigh) {
				firstHigh = g.at
			}
			if g.at.After(lastHigh) {
				lastHigh = g.at
			}
			if firstHighSeq == 0 || g.seq < firstHighSeq {
				firstHighSeq = g.seq
			}
			lastHighSeq = max(lastHighSeq, g.seq)
		case laneNormal:
			lastNormalSeq = max(lastNormalSeq, g.seq)
		}
	}
	var r strictPriorityRun
	for _, g := range grants {
		if g.lane == laneNormal && g.seq > firstHighSeq && g.seq < lastHighSeq {
			r.normalDuringHigh++
		}
		if g.lane == laneLow && g.seq < lastNormalSeq {
			r.lowBeforeNormalDone++
		}
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	r.firstHighAfter = firstHigh.Sub(highAt)
	r.highRate = 199 / lastHigh.Sub(firstHigh).Seconds()
	r.maxInSecond = maxInSecond(grants)
	return r
}

// maxInSecond returns the most grants in any one-second window.
func maxInSecond(gs []schedGrant) int {
	best, lo := 0, 0
	for hi := range gs {
		for gs[hi].at.Sub(gs[lo].at) >= time.Second {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

func TestDispatchSchedulerInFlightCap(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const slots = 3
	s := newScheduler(newPacer(10000, 10000, 100), slots)
	go func() { _ = s.run(ctx, func() bool { return true }) }()
	var inFlight, most atomic.Int64
	var n atomic.Int64
	var wgs []*sync.WaitGroup
	for lane := range numLanes {
		// Each lane alone could fill every slot (k > slots).
		wgs = append(wgs, runLane(ctx, s, lane, 40, 5, 0, func(schedGrant) {
			n.Add(1)
			cur := inFlight.Add(1)
			for {
				m := most.Load()
				if cur <= m || most.CompareAndSwap(m, cur) {
					break
				}
			}
			time.Sleep(5 * time.Millisecond) // the provider call
			inFlight.Add(-1)
		}))
	}
	for _, wg := range wgs {
		wg.Wait()
	}
	t.Logf("%d sends, at most %d in flight (cap %d)", n.Load(), most.Load(), slots)
	require.Equal(t, int64(120), n.Load())
	require.Equal(t, int64(slots), most.Load(), "the cap is reached and never exceeded, across lanes")
}

func TestDispatchSchedulerStopsWhenLeaseInvalid(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newScheduler(newPacer(200, 200, 1), 8)
	var valid atomic.Bool
	valid.Store(true)
	runErr := make(chan error, 1)
	go func() { runErr <- s.run(ctx, valid.Load) }()

	var granted atomic.Int64
	var invalidAt atomic.Int64
	var late atomic.Int64
	wg := runLane(ctx, s, laneNormal, 1000, 4, 0, func(schedGrant) {
		granted.Add(1)
		// A grant the scheduler made just before the switch may be
		// recorded a moment after it; tokens come every 5 ms.
		if at := invalidAt.Load(); at != 0 && time.Now().UnixNano() > at+int64(2*time.Millisecond) {
			late.Add(1)
		}
	})
	time.Sleep(200 * time.Millisecond)
	valid.Store(false)
	invalidAt.Store(time.Now().UnixNano())
	select {
	case err := <-runErr:
		require.ErrorIs(t, err, lease.ErrLost)
	case <-time.After(2 * time.Second):
		t.Fatal("the scheduler went on after the lease could not be confirmed")
	}
	wg.Wait() // the waiters were turned away (errSchedStopped)
	t.Logf("%d grants before the lease went invalid, %d after", granted.Load(), late.Load())
	require.Positive(t, granted.Load())
	require.Zero(t, late.Load(), "no grant once the lease is not valid")

	tk := s.begin(laneHigh)
	ok, err := tk.wait(ctx, time.Second)
	require.False(t, ok)
	require.ErrorIs(t, err, errSchedStopped, "a stopped session turns new jobs away at once")
}

// TestDispatchSchedulerIgnoresStaleEmpty: an "empty" from the server for a
// question asked before a high job began does not clear the high lane's
// backlog, so a normal waiter gets no turn while that job is handled or
// awaits its ack; an answer asked after it does.
func TestDispatchSchedulerIgnoresStaleEmpty(t *testing.T) {
	t.Parallel()
	s := newScheduler(newPacer(1000, 1, 10), 4)
	s.watched = true
	s.setBacklog(laneHigh, false)
	s.setBacklog(laneNormal, false)

	asked := s.beganSoFar(laneHigh) // the watcher asks the server...
	high := s.begin(laneHigh)       // ...a high job arrives meanwhile...
	high.finish()                   // ...and is handled, its ack on the way
	s.setBacklogAsOf(laneHigh, false, asked)
	normal := s.begin(laneNormal)
	s.mu.Lock()
	s.waiting[laneNormal].join(normal)
	require.Equal(t, -1, s.pick(), "no lane may be served on a stale empty")
	require.True(t, s.backlog[laneHigh])
	s.mu.Unlock()

	s.setBacklogAsOf(laneHigh, false, s.beganSoFar(laneHigh))
	s.mu.Lock()
	require.Equal(t, laneNormal, s.pick(), "a fresh empty lets normal go")
	s.mu.Unlock()
}
