package lease

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// FairShare spreads the leases of one kind of work (dispatch's accounts,
// status's fold partitions) over the replicas of a service. Each replica
// announces itself in KV broadcast_leases under "<prefix><id>" every
// Refresh (a prefix no lease key of the bucket begins with). A worker
// takes its lease only while its process holds fewer than its share,
// ceil(leases / live replicas), and a process holding more (a replica
// joined) hands the surplus back, so the work spreads evenly. A replica
// found gone while taking its lease (Gone), or by MayTake before it
// refuses (ReplicaGone), stops counting at once, not when its
// announcement is stale, so its leases are taken then and none is handed
// back for it to take. Without other replicas nothing changes: the share is every lease.
type FairShare struct {
	kv jetstream.KeyValue
	// Replica names this service instance; its workers' lease values
	// start with it (OwnerID).
	Replica string
	prefix  string
	// self is its announcement key.
	self  string
	total func() int // the leases this process may take

	// ReplicaGone, when set, reports whether the server says a replica's
	// connection is gone (Presence.Gone, which takes a replica id). Before
	// MayTake refuses, it asks it of the other replicas it counts, so a
	// killed replica's leases are taken at once, not after its last
	// announcement went stale. Set it before Run.
	ReplicaGone func(ctx context.Context, replica string) bool

	mu       sync.Mutex
	seen     map[string]time.Time // replica key -> when its announcement arrived
	gone     map[string]time.Time // replica key -> when Gone counted it out
	replicas map[string]string    // replica key -> its replica id, from its announcement
	owned    int
	// roundStart and roundLeft pace hand-backs (shouldGiveBack).
	roundStart   time.Time
	roundLeft    int
	announced    chan struct{} // closed once the replicas present at start are known (announce)
	announceOnce sync.Once
}

// replicaStale is how long a replica counts as live after its last
// announcement.
const replicaStale = 3 * Refresh

// giveBackEvery spaces hand-backs, so the others can take the accounts
// before the share is looked at again.
const giveBackEvery = 2 * Refresh

// NewFairShare is a share of the leases counted by total among the
// replicas announcing themselves in kv under prefix (ending in a dot).
func NewFairShare(kv jetstream.KeyValue, prefix string, total func() int) *FairShare {
	replica := NewReplicaID()
	return &FairShare{kv: kv, Replica: replica, prefix: prefix, self: replicaKey(prefix, replica),
		total: total, seen: map[string]time.Time{}, gone: map[string]time.Time{}, replicas: map[string]string{},
		announced: make(chan struct{})}
}

// replicaKey is the announcement key of replica under prefix.
func replicaKey(prefix, replica string) string {
	return prefix + strings.NewReplacer("/", "-", ".", "-").Replace(replica)
}

// Run announces this replica and follows the others until ctx ends. A
// watch that cannot start, or ends, is started again with the next
// announcement: a replica that stopped following the others would count
// itself alone and take every lease.
func (f *FairShare) Run(ctx context.Context) {
	// A replica without work it may take (dispatch: no account whose
	// channel it can send on) does not count.
	present := false
	announce := func() {
		actx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if f.total() == 0 {
			if present && f.kv.Delete(actx, f.self) == nil {
				present = false
			}
			return
		}
		if _, err := f.kv.Put(actx, f.self, []byte(time.Now().UTC().Format(time.RFC3339Nano)+" "+f.Replica)); err == nil {
			present = true
		}
	}
	var w jetstream.KeyWatcher
	var updates <-chan jetstream.KeyValueEntry
	watch := func() {
		if w != nil {
			_ = w.Stop()
		}
		w, updates = nil, nil
		if nw, err := f.kv.Watch(ctx, f.prefix+">"); err == nil {
			w, updates = nw, nw.Updates()
		}
	}
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	announce()
	watch()
	t := time.NewTicker(Refresh)
	defer t.Stop()
	// Replicas starting together see each other after one round of
	// announcements; until then none takes a lease.
	startup := time.After(Refresh + Refresh/2)
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), OpTimeout)
			_ = f.kv.Delete(dctx, f.self)
			cancel()
			return
		case <-startup:
			f.markAnnounced()
			startup = nil
		case <-t.C:
			announce()
			if updates == nil {
				watch()
			}
		case e, ok := <-updates:
			if !ok {
				updates = nil // started again at the next tick
				continue
			}
			if e == nil {
				continue
			}
			f.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				if at, gone := f.gone[e.Key()]; !gone || time.Since(at) >= replicaStale {
					delete(f.gone, e.Key())
					f.seen[e.Key()] = time.Now()
					// The value is "<time> <replica id>".
					if _, id, ok := strings.Cut(string(e.Value()), " "); ok {
						f.replicas[e.Key()] = id
					}
				}
			} else {
				delete(f.seen, e.Key())
				delete(f.replicas, e.Key())
			}
			f.mu.Unlock()
		}
	}
}

// markAnnounced closes announced, once even when Run runs again after a
// panic.
func (f *FairShare) markAnnounced() { f.announceOnce.Do(func() { close(f.announced) }) }

// Total is how many leases this process may take (the count NewFairShare
// was given).
func (f *FairShare) Total() int { return f.total() }

// share is how many leases this process should hold. Call with f.mu held.
func (f *FairShare) share() int {
	live := 0
	now := time.Now()
	for k, at := range f.gone {
		if now.Sub(at) >= replicaStale {
			delete(f.gone, k)
		}
	}
	for k, at := range f.seen {
		if now.Sub(at) < replicaStale {
			live++
		} else {
			delete(f.seen, k)
			delete(f.replicas, k)
		}
	}
	live = max(live, 1)
	return (f.total() + live - 1) / live
}

// MayTake reports whether this process may take one more lease; when it
// may, the lease counts as owned until Released.
func (f *FairShare) MayTake(ctx context.Context) bool {
	select {
	case <-f.announced:
	case <-ctx.Done():
		return false
	}
	f.mu.Lock()
	full := f.owned >= f.share()
	f.mu.Unlock()
	if full && !f.countOutGone(ctx) {
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

// countOutGone asks ReplicaGone about every other replica counted and
// counts out those the server says are gone (as Gone does). It reports
// whether it counted any out. Presence reuses its "alive" answers, so
// this costs at most a request per live replica every PresenceCache,
// however many workers ask; a gone one is counted out, and asked about
// again only once it announces itself again.
func (f *FairShare) countOutGone(ctx context.Context) bool {
	if f.ReplicaGone == nil {
		return false
	}
	f.mu.Lock()
	others := make(map[string]string, len(f.seen))
	for k := range f.seen {
		if id := f.replicas[k]; k != f.self && id != "" {
			others[k] = id
		}
	}
	f.mu.Unlock()
	counted := false
	for k, id := range others {
		if !f.ReplicaGone(ctx, id) {
			continue
		}
		f.countOut(k)
		counted = true
	}
	return counted
}

// Gone counts the replica holding owner's lease (an OwnerID) out of the
// replicas at once, when the server says its connection is gone
// (Presence.Gone): its last announcement would otherwise count for up to
// replicaStale more, and the share, too small meanwhile, would have
// ShouldGiveBack hand leases on to a replica that can no longer take
// them. An announcement arriving within replicaStale after (one already
// on its way) is ignored; a replica that reconnects counts again with the
// first one after that.
func (f *FairShare) Gone(owner string) {
	i := strings.LastIndex(owner, "/")
	if i < 0 {
		return
	}
	key := replicaKey(f.prefix, owner[:i])
	if key == f.self {
		return
	}
	f.countOut(key)
}

// countOut stops counting the replica announcing under key, and ignores
// its announcements for replicaStale.
func (f *FairShare) countOut(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.seen, key)
	delete(f.replicas, key)
	f.gone[key] = time.Now()
}

// TakeBeyond counts a lease taken beyond the share: one whose holder is
// gone must not wait until the other replicas hold fewer (call Gone
// first, so that the share counts the replicas left); ShouldGiveBack
// hands the surplus on later, to a live replica holding fewer.
func (f *FairShare) TakeBeyond() {
	f.mu.Lock()
	f.owned++
	f.mu.Unlock()
}

// Released is called when a worker gave its lease up (or failed to take
// it after MayTake).
func (f *FairShare) Released() {
	f.mu.Lock()
	f.owned--
	f.mu.Unlock()
}

// ErrGiveBack ends a worker's session whose lease it hands to a replica
// holding fewer (ShouldGiveBack).
var ErrGiveBack = errors.New("handing the lease to a replica holding fewer")

// ShouldGiveBack reports whether the calling worker should hand its lease
// to another replica, because this process holds more than its share; if
// so the lease no longer counts as owned. Each round (one per
// giveBackEvery) hands back at most the surplus seen at its start.
func (f *FairShare) ShouldGiveBack() bool {
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
