package dispatch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// fairShare spreads accounts over the dispatch replicas. Each replica
// announces itself in KV broadcast_leases under "replica.<id>" (account
// names cannot contain a dot, so these never clash with a lease) every
// lease.Refresh. A runner takes its account's lease only while its process
// holds fewer than its share, ceil(accounts / live replicas), and a process
// holding more (a replica joined) hands the surplus back, so the senders'
// work, and their provider connections, spread evenly: with a per-replica
// in-flight budget (Config.MaxInFlight) the capacity of N replicas adds up.
// Without other replicas nothing changes: the share is every account.
type fairShare struct {
	kv jetstream.KeyValue
	// replica names this service; its runners' lease values start with it.
	replica string
	// self is its announcement key.
	self  string
	total func() int // accounts this process runs

	mu    sync.Mutex
	seen  map[string]time.Time // replica key -> when its announcement arrived
	owned int
	// roundStart and roundLeft pace hand-backs (shouldGiveBack).
	roundStart   time.Time
	roundLeft    int
	announced    chan struct{} // closed once the replicas present at start are known (announce)
	announceOnce sync.Once
}

// replicaPrefix starts the keys replicas announce themselves under.
const replicaPrefix = "replica."

// replicaStale is how long a replica counts as live after its last
// announcement.
const replicaStale = 3 * lease.Refresh

// giveBackEvery spaces hand-backs, so the others can take the accounts
// before the share is looked at again.
const giveBackEvery = 2 * lease.Refresh

func newFairShare(kv jetstream.KeyValue, total func() int) *fairShare {
	replica := lease.NewReplicaID()
	return &fairShare{kv: kv, replica: replica, self: replicaPrefix + strings.NewReplacer("/", "-", ".", "-").Replace(replica),
		total: total, seen: map[string]time.Time{}, announced: make(chan struct{})}
}

// run announces this replica and follows the others until ctx ends.
func (f *fairShare) run(ctx context.Context) {
	w, err := f.kv.Watch(ctx, replicaPrefix+">")
	if err != nil {
		f.markAnnounced()
		return
	}
	defer func() { _ = w.Stop() }()
	// A replica without accounts it can send for (none of their channels
	// configured) does not count.
	present := false
	announce := func() {
		actx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
		defer cancel()
		if f.total() == 0 {
			if present && f.kv.Delete(actx, f.self) == nil {
				present = false
			}
			return
		}
		if _, err := f.kv.Put(actx, f.self, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err == nil {
			present = true
		}
	}
	announce()
	t := time.NewTicker(lease.Refresh)
	defer t.Stop()
	// Replicas starting together see each other after one round of
	// announcements; until then none takes a lease.
	startup := time.After(lease.Refresh + lease.Refresh/2)
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease.OpTimeout)
			_ = f.kv.Delete(dctx, f.self)
			cancel()
			return
		case <-startup:
			f.markAnnounced()
			startup = nil
		case <-t.C:
			announce()
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			f.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				f.seen[e.Key()] = time.Now()
			} else {
				delete(f.seen, e.Key())
			}
			f.mu.Unlock()
		}
	}
}

// markAnnounced closes announced, once even when run runs again after a
// panic.
func (f *fairShare) markAnnounced() { f.announceOnce.Do(func() { close(f.announced) }) }

// share is how many accounts this process should send for. Call with f.mu
// held.
func (f *fairShare) share() int {
	live := 0
	now := time.Now()
	for k, at := range f.seen {
		if now.Sub(at) < replicaStale {
			live++
		} else {
			delete(f.seen, k)
		}
	}
	live = max(live, 1)
	return (f.total() + live - 1) / live
}

// mayTake reports whether this process may take one more account; when it
// may, the account counts as owned until released.
func (f *fairShare) mayTake(ctx context.Context) bool {
	select {
	case <-f.announced:
	case <-ctx.Done():
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owned >= f.share() {
		return false
	}
	f.owned++
	return true
}

// released is called when a runner gave its account up (or failed to take
// it after mayTake).
func (f *fairShare) released() {
	f.mu.Lock()
	f.owned--
	f.mu.Unlock()
}

// errGiveBack ends a session whose account goes to a replica with fewer
// accounts.
var errGiveBack = errors.New("handing the account to a replica with fewer accounts")

// shouldGiveBack reports whether the calling runner should hand its
// account to another replica, because this process holds more than its
// share; if so the account no longer counts as owned. Each round (one per
// giveBackEvery) hands back at most the surplus seen at its start.
func (f *fairShare) shouldGiveBack() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	surplus := f.owned - f.share()
	if surplus <= 0 {
		return false
	}
	if now := time.Now(); now.Sub(f.roundStart) >= giveBackEvery {
		f.roundStart, f.roundLeft = now, surplus
	}
	if f.roundLeft == 0 {
		return false
	}
	f.roundLeft--
	f.owned--
	return true
}

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
