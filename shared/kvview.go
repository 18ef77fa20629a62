package shared

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// KVView is a live, decoded copy of a KV bucket's values.
type KVView[T any] struct {
	mu     sync.RWMutex
	values map[string]T
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
	v := &KVView[T]{values: map[string]T{}}
	gone := func(key string) {
		v.mu.Lock()
		delete(v.values, key)
		v.mu.Unlock()
		if onChange != nil {
			onChange(key)
		}
	}
	err = FollowBucket(ctx, kv, js.Conn(), log, func(e jetstream.KeyValueEntry, initial bool) {
		v.mu.Lock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(v.values, e.Key())
		} else if val, err := decode(e.Value()); err != nil {
			log.Warn("bad value in KV", "bucket", bucket, "key", e.Key(), "err", err)
			delete(v.values, e.Key())
		} else {
			v.values[e.Key()] = val
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
