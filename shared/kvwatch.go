package shared

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
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

// FollowBucket is FollowWatch over every key of kv, started over each time
// nc reconnects. A nats-server restart loses the watch's consumer, and the
// watch notices only by missed heartbeats: its view stayed stale for about
// 20 s (TestKVViewAfterServerRestart), during which a resume judged by a
// stale "processing" did nothing. After each reconnect the watch starts
// anew: apply gets the entries that changed meanwhile (initial false) and
// gone the keys that vanished; values already applied (same revision)
// are not applied again, while a removal marker seen again is (so a
// view's last applied revision still reaches the bucket's). Everything is
// called from one goroutine. It returns once the first initial values are
// applied.
func FollowBucket(ctx context.Context, kv jetstream.KeyValue, nc *nats.Conn, log *slog.Logger, apply func(e jetstream.KeyValueEntry, initial bool), gone func(key string)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	reconnected := nc.StatusChanged(nats.CONNECTED)
	ready := make(chan struct{})
	go func() {
		defer nc.RemoveStatusListener(reconnected)
		defer func() {
			if w != nil {
				_ = w.Stop()
			}
		}()
		revs := map[string]uint64{} // the revision applied per key present
		first := true               // the first initial values
		var seen map[string]bool    // keys of a restarted watch's initial values
		var updates <-chan jetstream.KeyValueEntry = w.Updates()
		for {
			select {
			case <-ctx.Done():
				return
			case <-reconnected:
				_ = w.Stop()
				w, updates = nil, nil
				for w == nil {
					nw, err := kv.WatchAll(ctx)
					if err == nil {
						w, updates, seen = nw, nw.Updates(), map[string]bool{}
						break
					}
					log.Warn("cannot watch the bucket again after a reconnect; retrying", "bucket", kv.Bucket(), "err", err)
					select {
					case <-ctx.Done():
						return
					case <-time.After(250 * time.Millisecond):
					}
				}
			case e, ok := <-updates:
				if !ok {
					return
				}
				if e == nil { // the end of the initial values
					if first {
						first = false
						close(ready)
					}
					if seen != nil {
						for key := range revs {
							if !seen[key] {
								delete(revs, key)
								if gone != nil {
									func() {
										defer Recover(log, "removing "+kv.Bucket()+" key "+key, nil)
										gone(key)
									}()
								}
							}
						}
						seen = nil
					}
					continue
				}
				if seen != nil {
					seen[e.Key()] = true
				}
				if rev, present := revs[e.Key()]; present && e.Revision() <= rev {
					continue // applied before the watch started over
				}
				if e.Operation() == jetstream.KeyValuePut {
					revs[e.Key()] = e.Revision()
				} else {
					delete(revs, e.Key())
				}
				func() {
					defer Recover(log, "applying "+e.Bucket()+" key "+e.Key(), nil)
					apply(e, first)
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
