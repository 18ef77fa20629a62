package dispatch

import "sync"

// nudger wakes every job waiting for its turn at once (awaitTurn) so that
// each checks again that it may still be sent: a task paused or cancelled
// applies to its waiting jobs when the change arrives, not at their next
// turnCheck. Waking them all costs a check each, once per change of a
// task's run state; their regular check can then be rare (1,000 accounts
// with 60 jobs each waiting spent a tenth of the CPU checking twice a
// second).
type nudger struct {
	mu sync.Mutex
	ch chan struct{}
}

// nudged is closed at the next nudge.
func (n *nudger) nudged() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// nudge wakes the jobs waiting now.
func (n *nudger) nudge() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
