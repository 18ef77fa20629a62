package suppress

import (
	"context"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Shared hands one View to the services of one process that each need
// one (render and dispatch under `broadcast all`, dev, demo and bench), so
// a list of millions is loaded and held once: at a million entries a view
// is about 120 MB and takes seconds to load. The first View call loads
// it, and that call's context bounds the view's life; the others wait for
// it. A failed load is tried again by the next call. The zero value is
// ready to use.
type Shared struct {
	mu sync.Mutex
	v  *View
}

// View returns the process's view, loading it through js on the first
// call. On a nil Shared it loads a view of the caller's own.
func (s *Shared) View(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*View, error) {
	if s == nil {
		return Watch(ctx, js, log)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v != nil {
		return s.v, nil
	}
	v, err := Watch(ctx, js, log)
	if err != nil {
		return nil, err
	}
	s.v = v
	return v, nil
}
