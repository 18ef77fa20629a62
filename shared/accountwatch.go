package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// AccountChange is delivered to an AccountWatcher's callback. Account is nil
// when the account was deleted or its value no longer parses.
type AccountChange struct {
	Name    string
	Account *contract.Account
}

// AccountWatcher keeps a live view of KV broadcast_accounts: edits apply
// without a restart.
type AccountWatcher struct {
	mu       sync.RWMutex
	accounts map[string]*contract.Account
	invalid  map[string]error
	onChange func(AccountChange)
	log      *slog.Logger
	js       jetstream.JetStream
	// applied is the bucket revision of the last change applied.
	applied atomic.Uint64
}

// WatchAccounts starts watching the accounts bucket and returns once the
// current values are loaded. onChange (optional) is called for every change,
// including the initial values, from a single goroutine.
func WatchAccounts(ctx context.Context, js jetstream.JetStream, log *slog.Logger, onChange func(AccountChange)) (*AccountWatcher, error) {
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	if err != nil {
		return nil, fmt.Errorf("accounts bucket: %w", err)
	}
	aw := &AccountWatcher{
		accounts: map[string]*contract.Account{},
		invalid:  map[string]error{},
		onChange: onChange,
		log:      log,
		js:       js,
	}
	if err := FollowBucket(ctx, kv, js.Conn(), log, func(e jetstream.KeyValueEntry, _ bool) { aw.apply(e) }, aw.remove); err != nil {
		return nil, fmt.Errorf("watch accounts: %w", err)
	}
	return aw, nil
}

func (aw *AccountWatcher) apply(e jetstream.KeyValueEntry) {
	name := e.Key()
	var acct *contract.Account
	if e.Operation() == jetstream.KeyValuePut {
		a, err := contract.DecodeAccount(name, e.Value())
		if err != nil {
			// A bad edit must not take down a running account silently: it is
			// logged loudly and the account stops until fixed.
			aw.log.Error("invalid account in KV; account stopped until fixed", KeyAccount, name, "err", err)
			aw.mu.Lock()
			aw.invalid[name] = err
			delete(aw.accounts, name)
			aw.mu.Unlock()
		} else {
			acct = a
			aw.mu.Lock()
			aw.accounts[name] = a
			delete(aw.invalid, name)
			aw.mu.Unlock()
		}
	} else {
		aw.mu.Lock()
		delete(aw.accounts, name)
		delete(aw.invalid, name)
		aw.mu.Unlock()
	}
	if aw.onChange != nil {
		aw.onChange(AccountChange{Name: name, Account: acct})
	}
	aw.applied.Store(e.Revision())
}

// remove drops an account whose key vanished while the watch was down (a
// server restart), as a deletion.
func (aw *AccountWatcher) remove(name string) {
	aw.mu.Lock()
	delete(aw.accounts, name)
	delete(aw.invalid, name)
	aw.mu.Unlock()
	if aw.onChange != nil {
		aw.onChange(AccountChange{Name: name})
	}
}

// CatchUp waits, up to timeout, until the view has applied every change the
// bucket held when it was called. The view follows the bucket moments
// behind: a task submitted right after `nats kv put` of its account must
// not be rejected for an account the view has not seen yet.
func (aw *AccountWatcher) CatchUp(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := aw.js.Stream(ctx, KVStream(contract.BucketAccounts))
	if err != nil {
		return fmt.Errorf("accounts bucket: %w", err)
	}
	last := st.CachedInfo().State.LastSeq
	for aw.applied.Load() < last {
		select {
		case <-ctx.Done():
			return fmt.Errorf("accounts view behind the bucket (revision %d of %d): %w", aw.applied.Load(), last, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// Get returns the named account, or nil.
func (aw *AccountWatcher) Get(name string) *contract.Account {
	aw.mu.RLock()
	defer aw.mu.RUnlock()
	return aw.accounts[name]
}

// Invalid returns the error of an account whose KV value does not parse.
func (aw *AccountWatcher) Invalid(name string) error {
	aw.mu.RLock()
	defer aw.mu.RUnlock()
	return aw.invalid[name]
}

// All returns every valid account, sorted by name.
func (aw *AccountWatcher) All() []*contract.Account {
	aw.mu.RLock()
	defer aw.mu.RUnlock()
	out := make([]*contract.Account, 0, len(aw.accounts))
	for _, a := range aw.accounts {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ErrNoAccount is returned when a task has no usable sender account.
var ErrNoAccount = errors.New("no enabled account")

// ForTask returns the enabled accounts a task of channel may use: the named
// ones, or every enabled account of the channel when names is empty.
func (aw *AccountWatcher) ForTask(channel string, names []string) []*contract.Account {
	var out []*contract.Account
	if len(names) == 0 {
		for _, a := range aw.All() {
			if a.Channel == channel && a.IsEnabled() {
				out = append(out, a)
			}
		}
		return out
	}
	for _, n := range names {
		if a := aw.Get(n); a != nil && a.Channel == channel && a.IsEnabled() {
			out = append(out, a)
		}
	}
	return out
}
