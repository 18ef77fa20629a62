package shared

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// workerIdle is how long a handler goroutine waits for another message
// before it ends.
const workerIdle = 10 * time.Second

// workers runs a consumer's handlers on goroutines started on demand: up
// to max at once, one more only when a message finds none free, each
// ending after workerIdle without work. Starting all max at once cost a
// dispatch with 1,000 accounts three million goroutines (three lanes of
// 1,024) and gigabytes of stacks, nearly all of them idle.
type workers struct {
	max  int
	run  func(m jetstream.Msg, slot *inFlightSlot)
	in   *inFlight
	work chan jetstream.Msg // a free worker receives here

	mu     sync.Mutex
	n      int           // running workers
	closed bool          // no more workers start
	exited chan struct{} // poked when a worker ends
	wg     sync.WaitGroup
}

func newWorkers(max int, run func(jetstream.Msg, *inFlightSlot), in *inFlight) *workers {
	return &workers{max: max, run: run, in: in, work: make(chan jetstream.Msg), exited: make(chan struct{}, 1)}
}

// give hands m to a free worker, or to a new one while fewer than max run,
// or waits for one to be free. It reports false when ctx ended first (or
// the pool is closed): m was not taken.
func (w *workers) give(ctx context.Context, m jetstream.Msg) bool {
	for {
		select {
		case w.work <- m:
			return true
		default:
		}
		w.mu.Lock()
		if w.closed || ctx.Err() != nil {
			w.mu.Unlock()
			return false
		}
		if w.n < w.max {
			w.n++
			w.wg.Add(1)
			w.mu.Unlock()
			go w.worker(ctx, m)
			return true
		}
		w.mu.Unlock()
		select {
		case w.work <- m:
			return true
		case <-w.exited: // one fewer running: look again
		case <-ctx.Done():
			return false
		}
	}
}

// worker handles first, then whatever it is given, until it has waited
// workerIdle for work or ctx ends.
func (w *workers) worker(ctx context.Context, first jetstream.Msg) {
	slot := w.in.add()
	defer func() {
		w.in.remove(slot)
		w.mu.Lock()
		w.n--
		w.mu.Unlock()
		select {
		case w.exited <- struct{}{}:
		default:
		}
		w.wg.Done()
	}()
	w.run(first, slot)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		idle.Reset(workerIdle)
		select {
		case m := <-w.work:
			w.run(m, slot)
		case <-ctx.Done():
			return
		case <-idle.C:
			return
		}
	}
}

// close stops new workers from starting and waits for the running ones.
func (w *workers) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}
