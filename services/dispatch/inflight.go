package dispatch

import "context"

// inFlightSlot is one of the replica's Config.MaxInFlight slots.
type inFlightSlot struct {
	ch   chan struct{}
	held bool
}

// takeInFlight waits for a slot of the replica's in-flight budget; with no
// budget it returns at once.
func (s *Service) takeInFlight(ctx context.Context) (*inFlightSlot, error) {
	if s.inFlight == nil {
		return &inFlightSlot{}, nil
	}
	select {
	case s.inFlight <- struct{}{}:
		return &inFlightSlot{ch: s.inFlight, held: true}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// free gives the slot back; it is safe to call more than once.
func (sl *inFlightSlot) free() {
	if sl.held {
		sl.held = false
		<-sl.ch
	}
}
