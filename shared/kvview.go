package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// KVView is a live, decoded copy of a KV bucket's values.
type KVView[T any] struct {
	kv     jetstream.KeyValue
	decode func([]byte) (T, error)

	mu     sync.RWMutex
	values map[string]T
	// revs is the bucket revision of each value held, so a value read by
	// Refresh is not undone by an older one the watch delivers later.
	revs map[string]uint64
}

// WatchKV follows bucket and keeps every key's decoded value, starting its
// watch over after each reconnect (FollowBucket); it returns once the
// current values are loaded. Values that do not decode are logged
// and treated as absent. onChange, if not nil, is called with the key after
// every change that follows the initial load.
func WatchKV[T any](ctx context.Context, js jetstream.JetStream, bucket string, decode func([]byte) (T, error), log *slog.Logger, onChange func(key string)) (*KVView[T], error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("%s bucket: %w", bucket, err)
	}
	v := &KVView[T]{kv: kv, decode: decode, values: map[string]T{}, revs: map[string]uint64{}}
	gone := func(key string) {
		v.mu.Lock()
		delete(v.values, key)
		delete(v.revs, key)
		v.mu.Unlock()
		if onChange != nil {
			onChange(key)
		}
	}
	err = FollowBucket(ctx, kv, js.Conn(), log, func(e jetstream.KeyValueEntry, initial bool) {
		v.mu.Lock()
		if rev, ok := v.revs[e.Key()]; ok && e.Revision() <= rev {
			v.mu.Unlock()
			return // Refresh already holds this value or a newer one
		}
		if e.Operation() != jetstream.KeyValuePut {
			delete(v.values, e.Key())
			delete(v.revs, e.Key())
		} else if val, err := decode(e.Value()); err != nil {
			log.Warn("bad value in KV", "bucket", bucket, "key", e.Key(), "err", err)
			delete(v.values, e.Key())
			delete(v.revs, e.Key())
		} else {
			v.values[e.Key()], v.revs[e.Key()] = val, e.Revision()
		}
		v.mu.Unlock()
		if onChange != nil && !initial {
			onChange(e.Key())
		}
	}, gone)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", bucket, err)
	}
	return v, nil
}

// Get returns the value under key and whether there is one.
func (v *KVView[T]) Get(key string) (T, bool) {
	var zero T
	if v == nil {
		return zero, false
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	val, ok := v.values[key]
	return val, ok
}

// Refresh reads key from the bucket, for a decision that must not rest on
// a view that lags (its watch fell behind under load, or starts over after
// a reconnect), and keeps a newer value in the view so the fast path (Get)
// sees it too. An absent key is reported absent without touching the view:
// a value the watch delivered meanwhile may be newer than the read.
func (v *KVView[T]) Refresh(ctx context.Context, key string) (T, bool, error) {
	var zero T
	e, err := v.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return zero, false, nil
	}
	if err != nil {
		return zero, false, fmt.Errorf("%s key %s: %w", v.kv.Bucket(), key, err)
	}
	val, err := v.decode(e.Value())
	if err != nil {
		return zero, false, fmt.Errorf("%s key %s: %w", v.kv.Bucket(), key, err)
	}
	v.mu.Lock()
	if rev, ok := v.revs[key]; !ok || e.Revision() > rev {
		v.values[key], v.revs[key] = val, e.Revision()
	}
	v.mu.Unlock()
	return val, true, nil
}

// Keys returns every key present.
func (v *KVView[T]) Keys() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]string, 0, len(v.values))
	for k := range v.values {
		out = append(out, k)
	}
	return out
}
