package shared

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// FollowWatch hands every entry of a KV watcher to apply, from one
// goroutine, until ctx ends or the watcher closes (then it stops the
// watcher). initial is true for the values that were there when the watch
// began. It returns once those are applied, or ctx.Err() if ctx ends
// first.
func FollowWatch(ctx context.Context, w jetstream.KeyWatcher, apply func(e jetstream.KeyValueEntry, initial bool)) error {
	ready := make(chan struct{})
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the end of the initial values
					if initial {
						close(ready)
						initial = false
					}
					continue
				}
				apply(e, initial)
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
