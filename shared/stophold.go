package shared

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// stopHold keeps the messages a stopping consume loop hands back (NAKs)
// until its subscription has ended. NAKed while the subscription still
// stood, a message came straight back to it and was NAKed again by the
// loop, dozens of times within a millisecond (a dispatch stop, in the
// tests on a loaded machine: delivery 77), each delivery unseen by any
// handler, so the next process could not tell it from one that died in
// its provider call. Once the subscription is gone (its UNSUB goes out
// before the NAKs on the same connection), a NAKed message goes to the
// next consumer.
type stopHold struct {
	// stopping is the consume loop's context: once it is done, NAKs are
	// held. Asked at each NAK, not told by the loop, which may get to it
	// after a handler or the subscription's callback has NAKed.
	stopping context.Context
	// leftAtStop (ConsumeConfig.LeftAtStop, may be nil) is told of each
	// delivery no handler saw before it is handed back; ctx is its context.
	leftAtStop func(context.Context, jetstream.Msg)
	ctx        context.Context

	mu       sync.Mutex
	released bool
	naks     []heldNak
}

type heldNak struct {
	m     jetstream.Msg
	delay time.Duration
	// unseen says no handler saw this delivery: it came to the loop after
	// the stop began.
	unseen bool
}

// nak NAKs m with delay now, or holds it while stopping. unseen says no
// handler saw this delivery.
func (h *stopHold) nak(m jetstream.Msg, delay time.Duration, unseen bool) error {
	if h != nil && h.stopping.Err() != nil {
		h.mu.Lock()
		if !h.released {
			h.naks = append(h.naks, heldNak{m: m, delay: delay, unseen: unseen})
			h.mu.Unlock()
			return nil
		}
		h.mu.Unlock()
		if unseen && h.leftAtStop != nil {
			h.leftAtStop(h.ctx, m)
		}
	}
	return nakAfter(m, delay)
}

// release NAKs what was held, after leftAtStop has seen each delivery no
// handler saw; later NAKs go out at once.
func (h *stopHold) release() {
	h.mu.Lock()
	h.released = true
	naks := h.naks
	h.naks = nil
	h.mu.Unlock()
	for _, n := range naks {
		if n.unseen && h.leftAtStop != nil {
			h.leftAtStop(h.ctx, n.m)
		}
		_ = nakAfter(n.m, n.delay)
	}
}

func nakAfter(m jetstream.Msg, delay time.Duration) error {
	if delay <= 0 {
		return m.Nak()
	}
	return m.NakWithDelay(delay)
}
