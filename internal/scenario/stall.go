package scenario

import (
	"sync"
	"time"
)

// Stall is a span in which the runner's process did not run: on a loaded
// machine the operating system or the Go runtime may hold it back for tens
// of milliseconds. The fakes run in this process and stamp each request as
// they read it, so the requests that arrived during a stall are stamped
// together at its end, and a one-second window starting there counts more
// than the sender sent in any second. The rate check leaves such requests
// out by when dispatch began them (rate.go); a rate failure names the
// stall just before its window, to tell what held them.
type Stall struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

const (
	// stallTick is how often the probe wakes.
	stallTick = time.Millisecond
	// stallMin is the lateness a wake must exceed to be a stall: a sleep
	// of a millisecond ends up to a few hundred microseconds late on an
	// idle machine.
	stallMin = 4 * time.Millisecond
)

// stallProbe records the stalls of this process while it runs: a
// goroutine sleeps a tick at a time, and a wake that came stallMin or more
// later than asked is a stall from the previous wake to this one.
type stallProbe struct {
	mu       sync.Mutex
	stalls   []Stall
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func startStallProbe() *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *stallProbe) run() {
	defer close(p.done)
	t := time.NewTicker(stallTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			// The ticker's value is when it fired, not when this runs.
			last = p.wake(last, time.Now())
		}
	}
}

// wake notes a wake at now after the one at last, a stall if it came
// stallMin late, and returns now.
func (p *stallProbe) wake(last, now time.Time) time.Time {
	if now.Sub(last) >= stallTick+stallMin {
		p.mu.Lock()
		p.stalls = append(p.stalls, Stall{From: last, To: now})
		p.mu.Unlock()
	}
	return now
}

// Stop ends the probe and returns the stalls it saw, oldest first. It
// may be called more than once.
func (p *stallProbe) Stop() []Stall {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalls
}

// stallSettle is how long after a stall's end the requests held by it may
// still be stamped: the fakes' handlers run after the probe, one by one.
const stallSettle = 10 * time.Millisecond

// stallBefore returns the longest of stalls (oldest first) that may have
// held requests back past t: one that began before t and ended at most
// stallSettle before it.
func stallBefore(stalls []Stall, t time.Time) time.Duration {
	var longest time.Duration
	for _, s := range stalls {
		if !s.From.Before(t) {
			break
		}
		if t.Sub(s.To) <= stallSettle {
			longest = max(longest, s.To.Sub(s.From))
		}
	}
	return longest
}
