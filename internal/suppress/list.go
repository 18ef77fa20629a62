package suppress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// List writes and reads the suppression list in KV broadcast_suppressions.
type List struct {
	kv jetstream.KeyValue
}

// Open opens the bucket (created by `broadcast setup`).
func Open(ctx context.Context, js jetstream.JetStream) (*List, error) {
	kv, err := js.KeyValue(ctx, contract.BucketSuppressions)
	if err != nil {
		return nil, fmt.Errorf("%s bucket: %w", contract.BucketSuppressions, err)
	}
	return &List{kv: kv}, nil
}

// Prepare normalizes e.To for scope, fills At when unset, validates the
// entry and returns its key. Errors name the field.
func Prepare(scope string, e *contract.Suppression) (string, error) {
	if !contract.ValidScope(scope) {
		return "", fmt.Errorf("scope: want %q or a channel name, got %q", contract.ScopeAll, scope)
	}
	to, err := Normalize(scope, e.To)
	if err != nil {
		return "", err
	}
	e.To = to
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	if err := e.Validate(); err != nil {
		return "", err
	}
	if e.Categories == nil {
		// The value always has "categories": [] for every category.
		e.Categories = []contract.Category{}
	}
	return contract.SuppressionKey(scope, to), nil
}

// Put adds or replaces the entry for e.To in scope and returns its key.
func (l *List) Put(ctx context.Context, scope string, e contract.Suppression) (string, error) {
	key, err := Prepare(scope, &e)
	if err != nil {
		return "", err
	}
	data, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	if _, err := l.kv.Put(ctx, key, data); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	return key, nil
}

// Merge adds e without weakening what is there: an entry without Until
// (an opt-out) is never replaced by one with Until (a hold); two holds
// keep the later Until; two permanent entries keep the union of their
// categories (empty, all categories, wins). It is for automatic sources
// (feedback), whose repeated or reordered reports must not lift an
// opt-out. Writes are compare-and-set, retried on a concurrent change.
func (l *List) Merge(ctx context.Context, scope string, e contract.Suppression) (string, error) {
	key, err := Prepare(scope, &e)
	if err != nil {
		return "", err
	}
	for range 10 {
		cur, err := l.kv.Get(ctx, key)
		var rev uint64
		next := e
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return "", fmt.Errorf("get %s: %w", key, err)
		default:
			rev = cur.Revision()
			var old contract.Suppression
			if json.Unmarshal(cur.Value(), &old) == nil {
				merged, changed := merge(old, e, time.Now())
				if !changed {
					return key, nil
				}
				next = merged
			}
		}
		data, err := json.Marshal(next)
		if err != nil {
			return "", err
		}
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, data)
		} else {
			_, err = l.kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return key, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return "", fmt.Errorf("write %s: %w", key, err)
		}
	}
	return "", fmt.Errorf("write %s: changed concurrently too often", key)
}

// isWrongSequence reports a compare-and-set that lost to another writer.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// merge combines an existing entry with a new one (see Merge); changed is
// false when old already says everything new does.
func merge(old, new contract.Suppression, now time.Time) (contract.Suppression, bool) {
	oldActive := old.Until == nil || now.Before(*old.Until)
	switch {
	case !oldActive:
		return new, true
	case old.Until == nil && new.Until != nil:
		// A permanent entry stands; a hold for categories it does not
		// cover is dropped rather than turning the opt-out into a hold.
		return old, false
	case old.Until != nil && new.Until == nil:
		return new, true
	case old.Until != nil && new.Until != nil:
		if new.Until.After(*old.Until) {
			return new, true
		}
		return old, false
	}
	// Both permanent: widen the categories.
	if len(old.Categories) == 0 {
		return old, false
	}
	if len(new.Categories) == 0 {
		return new, true
	}
	out, changed := old, false
	for _, c := range new.Categories {
		if !slices.Contains(out.Categories, c) {
			out.Categories = append(slices.Clone(out.Categories), c)
			changed = true
		}
	}
	return out, changed
}

// Remove deletes the entry for to in scope; removing an absent entry is no
// error. It returns the key.
func (l *List) Remove(ctx context.Context, scope, to string) (string, error) {
	if !contract.ValidScope(scope) {
		return "", fmt.Errorf("scope: want %q or a channel name, got %q", contract.ScopeAll, scope)
	}
	n, err := Normalize(scope, to)
	if err != nil {
		return "", err
	}
	key := contract.SuppressionKey(scope, n)
	if err := l.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("delete %s: %w", key, err)
	}
	return key, nil
}

// Stored is one entry of the list with its key and scope.
type Stored struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
	contract.Suppression
}

// All reads every entry, calling fn for each; entries that do not decode
// are passed with only Key and Scope. It reads the bucket with one watch
// (one pass over its stream, not a get per key), so listing a million
// entries takes seconds.
func (l *List) All(ctx context.Context, fn func(Stored) error) error {
	w, err := l.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch of the suppression list closed early")
			}
			if e == nil { // the end of the current entries
				return nil
			}
			st := Stored{Key: e.Key(), Scope: scopeOf(e.Key())}
			_ = json.Unmarshal(e.Value(), &st.Suppression)
			if err := fn(st); err != nil {
				return err
			}
		}
	}
}

// scopeOf is the scope part of a key.
func scopeOf(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '.' {
			return key[:i]
		}
	}
	return ""
}
