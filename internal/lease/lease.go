package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A holder counts its lease as valid only until the start of its last
// successful refresh plus the TTL minus Margin. The server stamps the
// refresh no earlier than the request left, and removes it no earlier than
// a TTL after that stamp, so a former holder starts its last piece of work
// at least Margin before anyone else can hold the lease: for dispatch, no
// one-second window holds sends of both, and an account's rate holds
// across replicas.
const (
	// Refresh is how often the holder refreshes its lease and how often
	// the others try to take it (they also watch the key, so a released
	// lease is taken at once).
	Refresh = time.Second
	// Margin is how long before the server could remove the lease the
	// holder stops starting work.
	Margin = 1500 * time.Millisecond
	// OpTimeout bounds one lease request (a refresh waits longer while
	// the lease is still valid).
	OpTimeout = time.Second
)

// ErrLost means the holder no longer holds the lease.
var ErrLost = errors.New("lease lost")

var leaseSeq atomic.Uint64

// NewReplicaID names one service instance: host, process and a random
// part, so that a restarted process never takes an earlier holder's lease
// for its own.
func NewReplicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// OwnerID names one holder within replica (a holder restarted in the same
// process gets a new one).
func OwnerID(replica string) string {
	return fmt.Sprintf("%s/%d", replica, leaseSeq.Add(1))
}

// Lease is one holder's claim on a key.
type Lease struct {
	kv  jetstream.KeyValue
	key string
	ttl time.Duration

	// Owner is the value the lease holds while this holder has it: an
	// OwnerID, of a replica of its own unless set before the first
	// TryAcquire.
	Owner string
	// HolderGone reports whether the server says the process holding
	// owner's lease has no connection (Presence.Gone); nil: never.
	HolderGone func(ctx context.Context, owner string) bool
	// Conn reports whether this process's connection is up and how often
	// it has been lost (ConnWatch.State); nil: always up.
	Conn func() (up bool, losses uint64)
	// TookFrom is the holder whose lease TryAcquire last removed because
	// its connection was gone ("" when it was free); the caller's own.
	TookFrom string

	mu         sync.Mutex
	rev        uint64    // revision of the lease this holder has; 0 when none
	validUntil time.Time // when this holder stops counting its lease as held
	reconnects uint64    // Conn's losses when the lease was last confirmed
}

// New is a lease on key in kv, a bucket whose TTL is ttl.
func New(kv jetstream.KeyValue, key string, ttl time.Duration) *Lease {
	return &Lease{kv: kv, key: key, Owner: OwnerID(NewReplicaID()), ttl: ttl}
}

// Key is the lease's key in its bucket.
func (l *Lease) Key() string { return l.key }

// TryAcquire takes the lease if nobody holds it, or if its holder's
// connection is gone (HolderGone). It reports whether this holder has it
// now.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	start, reconnects := time.Now(), l.reconnectCount()
	l.TookFrom = ""
	rev, err := l.kv.Create(ctx, l.key, []byte(l.Owner))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, err
		}
		e, gerr := l.kv.Get(ctx, l.key)
		if gerr != nil {
			return false, nil
		}
		switch holder := string(e.Value()); {
		case holder == l.Owner:
			// A Create whose answer was lost may have succeeded: take back
			// a lease that names this holder rather than wait for it to
			// expire.
			start, reconnects = time.Now(), l.reconnectCount()
			if rev, err = l.kv.Update(ctx, l.key, []byte(l.Owner), e.Revision()); err != nil {
				return false, nil
			}
		case l.HolderGone != nil && l.HolderGone(ctx, holder):
			// The holder's connection is closed (a killed process): remove
			// its lease, that revision only, and take the account now.
			if l.kv.Delete(ctx, l.key, jetstream.LastRevision(e.Revision())) != nil {
				return false, nil
			}
			start, reconnects = time.Now(), l.reconnectCount()
			if rev, err = l.kv.Create(ctx, l.key, []byte(l.Owner)); err != nil {
				return false, nil
			}
			l.TookFrom = holder
		default:
			return false, nil
		}
	}
	l.mu.Lock()
	l.rev, l.validUntil, l.reconnects = rev, start.Add(l.ttl-Margin), reconnects
	l.mu.Unlock()
	return true, nil
}

// reconnectCount is how often this process's connection has been lost.
func (l *Lease) reconnectCount() uint64 {
	if l.Conn == nil {
		return 0
	}
	_, n := l.Conn()
	return n
}

// Refresh extends the lease. ErrLost means someone else holds it (or it
// expired); any other error may be passing, and the lease stays valid until
// Until. A refresh that timed out may still have been stored: the next one
// then finds a newer revision that names this holder and confirms that one.
func (l *Lease) Refresh(ctx context.Context) error {
	l.mu.Lock()
	rev, until := l.rev, l.validUntil
	l.mu.Unlock()
	if rev == 0 {
		return ErrLost
	}
	// The answer is worth waiting for while the lease is still valid: the
	// new term counts from this refresh's start however late it comes, and
	// a loaded server or connection can take longer than OpTimeout (1,000
	// accounts refresh every second).
	opCtx, cancel := context.WithTimeout(ctx, max(OpTimeout, time.Until(until)))
	defer cancel()
	start, reconnects := time.Now(), l.reconnectCount()
	next, err := l.kv.Update(opCtx, l.key, []byte(l.Owner), rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// An earlier refresh whose answer came too late (it timed out
		// here) may have been stored: if the lease still names this
		// holder, confirm it at the revision it has now.
		retryCtx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if e, gerr := l.kv.Get(retryCtx, l.key); gerr == nil && string(e.Value()) == l.Owner {
			start, reconnects = time.Now(), l.reconnectCount()
			next, err = l.kv.Update(retryCtx, l.key, []byte(l.Owner), e.Revision())
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.rev, l.validUntil, l.reconnects = next, start.Add(l.ttl-Margin), reconnects
		return nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyNotFound):
		l.rev, l.validUntil = 0, time.Time{}
		return ErrLost
	default:
		return err
	}
}

// Valid reports whether this holder may start work now: it holds the
// lease, confirmed recently enough, and its connection has stayed up since
// (while it is down another process may take the lease, see presence.go).
func (l *Lease) Valid() bool {
	l.mu.Lock()
	rev, until, reconnects := l.rev, l.validUntil, l.reconnects
	l.mu.Unlock()
	if rev == 0 || !time.Now().Before(until) {
		return false
	}
	if l.Conn == nil {
		return true
	}
	up, n := l.Conn()
	return up && n == reconnects
}

// Until returns when the lease stops being valid.
func (l *Lease) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Release deletes the lease if this holder still has it, so another
// process takes it at once.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.rev, l.validUntil = 0, time.Time{}
	l.mu.Unlock()
	if rev == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// Still ours at a later revision (a refresh stored after its
		// answer timed out), or no longer ours: nothing to release.
		e, gerr := l.kv.Get(ctx, l.key)
		if gerr != nil || string(e.Value()) != l.Owner {
			return nil
		}
		err = l.kv.Delete(ctx, l.key, jetstream.LastRevision(e.Revision()))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil
		}
	}
	return err
}

// Drop forgets the lease without touching the server (it was lost).
func (l *Lease) Drop() {
	l.mu.Lock()
	l.rev, l.validUntil = 0, time.Time{}
	l.mu.Unlock()
}

// WatchReleased returns a channel that receives when key's lease in kv is
// deleted or purged (a holder released it), so a waiting process takes it
// at once; nil when the watch cannot start, and the caller then only
// polls. Refreshes (puts) are not signalled.
func WatchReleased(ctx context.Context, kv jetstream.KeyValue, key string) (<-chan struct{}, error) {
	w, err := kv.Watch(ctx, key, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	out := make(chan struct{}, 1)
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() == jetstream.KeyValuePut {
					continue
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, nil
}
