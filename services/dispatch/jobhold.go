package dispatch

import (
	"context"
	"sync"
	"time"
)

// Two messages of one job can be live at once: a job published again
// after JOBS's duplicate window forgot the first (a batch rendered again
// by a resumed expansion, a retry-dead repeated after a crash), or a
// crashed original beside its copy. Each is checked for an earlier send
// (sentBefore), but two checked side by side both find none and both send
// (16 sends for 8 jobs queued twice, TestTwoMessagesOfOneJobSendOnce). So
// a delivery that is checked holds its job here, by id, until it is
// settled (its sent event stored), and a delivery of another message of
// the job waits for it before its own check, which then finds the send.
// The messages of one job go to one account, which one process consumes,
// so a hold within the process is enough.
//
// The wait is bounded (holdWait): the holder may wait long for its turn,
// and two job groups holding each other's jobs would wait for each other
// (each is settled once all its parts are). Past it the delivery goes on
// unheld and is checked as before.

// holdWait bounds how long a delivery waits for another message of its
// job.
const holdWait = 30 * time.Second

// jobHolds is the jobs held by the deliveries being checked and handled
// here, by job id.
type jobHolds struct {
	mu sync.Mutex
	m  map[string]chan struct{} // closed on release
}

func newJobHolds() *jobHolds { return &jobHolds{m: map[string]chan struct{}{}} }

// hold takes job id, waiting at most maxWait (or until ctx ends) while
// another delivery holds it. It returns the release (safe to call more
// than once) and whether it waited for another delivery; past maxWait
// the release does nothing.
func (h *jobHolds) hold(ctx context.Context, id string, maxWait time.Duration) (release func(), waited bool) {
	var timeout <-chan time.Time
	for {
		h.mu.Lock()
		held, busy := h.m[id]
		if !busy {
			ch := make(chan struct{})
			h.m[id] = ch
			h.mu.Unlock()
			return sync.OnceFunc(func() {
				h.mu.Lock()
				delete(h.m, id)
				h.mu.Unlock()
				close(ch)
			}), waited
		}
		h.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(maxWait)
			defer t.Stop()
			timeout = t.C
		}
		waited = true
		select {
		case <-held:
		case <-ctx.Done():
			return func() {}, waited
		case <-timeout:
			return func() {}, waited
		}
	}
}
