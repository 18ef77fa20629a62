package status

import (
	"fmt"

	"github.com/broadcastd/broadcast/contract"
)

// breakerWindow remembers a task's last attempt outcomes for the circuit
// breaker: a failure rate over a sliding window, not an error count, so a
// large healthy task is not stopped by a handful of bad addresses while a
// broken one stops within one window.
type breakerWindow struct {
	ring    []bool // true = failed attempt
	next    int
	filled  int
	fails   int
	tripped bool
}

// record adds an attempt outcome. Waits for caps or account health are not
// attempts, and neither are skips.
//
// A call-level failure of a batch call counts once (CallShared marks the
// repeats): one 429 for a call of 2,000 recipients is one bad answer, not
// a window full of them.
func (b *breakerWindow) record(ev *contract.Event) {
	if b.ring == nil || ev.CallShared {
		return
	}
	var failed bool
	switch ev.Kind {
	case contract.EventSent:
	case contract.EventFailed:
		failed = true
	case contract.EventRetrying:
		if ev.Requeued || waitCode(ev.Code) {
			return
		}
		failed = true
	default:
		return
	}
	if b.filled == len(b.ring) {
		if b.ring[b.next] {
			b.fails--
		}
	} else {
		b.filled++
	}
	b.ring[b.next] = failed
	if failed {
		b.fails++
	}
	b.next = (b.next + 1) % len(b.ring)
}

// check reports a reason to pause when the window is full and its failure
// rate reaches threshold; it trips once until reset.
func (b *breakerWindow) check(threshold float64) (string, bool) {
	if b.ring == nil || b.tripped || b.filled < len(b.ring) {
		return "", false
	}
	rate := float64(b.fails) / float64(b.filled)
	if rate < threshold {
		return "", false
	}
	b.tripped = true
	return fmt.Sprintf("circuit breaker: %.0f%% of the last %d attempts failed (threshold %.0f%%)", rate*100, b.filled, threshold*100), true
}

// reset empties the window, e.g. after the task is resumed.
func (b *breakerWindow) reset(size int) {
	*b = breakerWindow{}
	if size > 0 {
		b.ring = make([]bool, size)
	}
}
