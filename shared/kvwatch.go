package shared

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// FollowWatch hands every entry of a KV watcher to apply, from one
// goroutine, until ctx ends or the watcher closes (then it stops the
// watcher). initial is true for the values that were there when the watch
// began. It returns once those are applied, or ctx.Err() if ctx ends
// first. A panic in apply is logged to log with its stack and that entry
// skipped: the values come from whoever may write the bucket, and one
// must not take the service down (nor every replica, in turn).
func FollowWatch(ctx context.Context, w jetstream.KeyWatcher, log *slog.Logger, apply func(e jetstream.KeyValueEntry, initial bool)) error {
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
				func() {
					defer Recover(log, "applying "+e.Bucket()+" key "+e.Key(), nil)
					apply(e, initial)
				}()
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
