package dispatch

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

	"github.com/broadcastd/broadcast/shared"
)

// An account's lease in KV broadcast_leases decides which dispatch process
// sends for it: the key is the account, the value the owner's instance id.
// The bucket's TTL (shared.LeaseTTL) removes a lease its owner stopped
// refreshing, so a crashed owner loses the account after at most that long;
// a stopping owner deletes its lease, and another replica takes over at once.
//
// The owner counts its lease as valid only until the start of its last
// successful refresh plus the TTL minus leaseMargin. The server stamps the
// refresh no earlier than the request left, and removes it no earlier than a
// TTL after that stamp, so a former owner starts its last send at least
// leaseMargin before anyone else can hold the lease: no one-second window
// holds sends of both, and the account's rate holds across replicas.
const (
	// leaseRefresh is how often the owner refreshes its lease and how often
	// a non-owner tries to take it (a non-owner also watches the key, so a
	// released lease is taken at once).
	leaseRefresh = time.Second
	// leaseMargin is how long before the server could remove the lease the
	// owner stops starting sends.
	leaseMargin = 1500 * time.Millisecond
	// leaseOpTimeout bounds one lease request.
	leaseOpTimeout = time.Second
)

// errLeaseLost means the runner no longer owns its account.
var errLeaseLost = errors.New("account lease lost")

var leaseSeq atomic.Uint64

// newReplicaID names one dispatch service: host, process and a random
// part, so that a restarted process never takes an earlier holder's lease
// for its own.
func newReplicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ownerID names one runner of replica (a restarted runner in the same
// process gets a new one).
func ownerID(replica string) string {
	return fmt.Sprintf("%s/%d", replica, leaseSeq.Add(1))
}

// newOwnerID names a runner of a replica of its own.
func newOwnerID() string { return ownerID(newReplicaID()) }

// lease is one runner's claim on its account.
type lease struct {
	kv    jetstream.KeyValue
	key   string
	owner string
	ttl   time.Duration

	// holderGone reports whether the server says the process holding
	// owner's lease has no connection (presence.gone); nil: never.
	holderGone func(ctx context.Context, owner string) bool
	// conn reports whether this process's connection is up and how often
	// it has been lost (Service.connState); nil: always up.
	conn func() (up bool, losses uint64)

	// tookFrom is the holder whose lease tryAcquire last removed because
	// its connection was gone ("" when it was free); the runner's own.
	tookFrom string

	mu         sync.Mutex
	rev        uint64    // revision of the lease this runner holds; 0 when none
	validUntil time.Time // when this runner stops counting its lease as held
	reconnects uint64    // conn's losses when the lease was last confirmed
}

func newLease(kv jetstream.KeyValue, account string, ttl time.Duration) *lease {
	return &lease{kv: kv, key: account, owner: newOwnerID(), ttl: ttl}
}

// tryAcquire takes the lease if nobody holds it. It reports whether this
// runner now owns the account.
func (l *lease) tryAcquire(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseOpTimeout)
	defer cancel()
	start, reconnects := time.Now(), l.reconnectCount()
	l.tookFrom = ""
	rev, err := l.kv.Create(ctx, l.key, []byte(l.owner))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, err
		}
		e, gerr := l.kv.Get(ctx, l.key)
		if gerr != nil {
			return false, nil
		}
		switch holder := string(e.Value()); {
		case holder == l.owner:
			// A Create whose answer was lost may have succeeded: take back
			// a lease that names this runner rather than wait for it to
			// expire.
			start, reconnects = time.Now(), l.reconnectCount()
			if rev, err = l.kv.Update(ctx, l.key, []byte(l.owner), e.Revision()); err != nil {
				return false, nil
			}
		case l.holderGone != nil && l.holderGone(ctx, holder):
			// The holder's connection is closed (a killed process): remove
			// its lease, that revision only, and take the account now.
			if l.kv.Delete(ctx, l.key, jetstream.LastRevision(e.Revision())) != nil {
				return false, nil
			}
			start, reconnects = time.Now(), l.reconnectCount()
			if rev, err = l.kv.Create(ctx, l.key, []byte(l.owner)); err != nil {
				return false, nil
			}
			l.tookFrom = holder
		default:
			return false, nil
		}
	}
	l.mu.Lock()
	l.rev, l.validUntil, l.reconnects = rev, start.Add(l.ttl-leaseMargin), reconnects
	l.mu.Unlock()
	return true, nil
}

// reconnectCount is how often this process's connection has been lost.
func (l *lease) reconnectCount() uint64 {
	if l.conn == nil {
		return 0
	}
	_, n := l.conn()
	return n
}

// refresh extends the lease. errLeaseLost means someone else holds it (or it
// expired); any other error may be passing, and the lease stays valid until
// its validUntil.
func (l *lease) refresh(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	if rev == 0 {
		return errLeaseLost
	}
	ctx, cancel := context.WithTimeout(ctx, leaseOpTimeout)
	defer cancel()
	start, reconnects := time.Now(), l.reconnectCount()
	next, err := l.kv.Update(ctx, l.key, []byte(l.owner), rev)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.rev, l.validUntil, l.reconnects = next, start.Add(l.ttl-leaseMargin), reconnects
		return nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyNotFound):
		l.rev, l.validUntil = 0, time.Time{}
		return errLeaseLost
	default:
		return err
	}
}

// valid reports whether this runner may start a send now: it holds the
// lease, confirmed recently enough, and its connection has stayed up since
// (while it is down a standby may take the lease, see presence.go).
func (l *lease) valid() bool {
	l.mu.Lock()
	rev, until, reconnects := l.rev, l.validUntil, l.reconnects
	l.mu.Unlock()
	if rev == 0 || !time.Now().Before(until) {
		return false
	}
	if l.conn == nil {
		return true
	}
	up, n := l.conn()
	return up && n == reconnects
}

// until returns when the lease stops being valid.
func (l *lease) until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// release deletes the lease if this runner still holds it, so another
// replica takes the account over at once.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.rev, l.validUntil = 0, time.Time{}
	l.mu.Unlock()
	if rev == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, leaseOpTimeout)
	defer cancel()
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // no longer ours: nothing to release
	}
	return err
}

// drop forgets the lease without touching the server (it was lost).
func (l *lease) drop() {
	l.mu.Lock()
	l.rev, l.validUntil = 0, time.Time{}
	l.mu.Unlock()
}

// A runner waits for its account's lease (watchLease, acquire) and keeps
// it while it sends (keepLease).

// watchLease returns a channel that receives when the account's lease is
// deleted (nil when the watch cannot start: acquire then only
// polls), so a released lease is taken at once.
func (r *accountRunner) watchLease(ctx context.Context) <-chan struct{} {
	w, err := r.svc.leases.Watch(ctx, r.name, jetstream.UpdatesOnly())
	if err != nil {
		r.log.Warn("cannot watch the account's lease; polling it", "err", err)
		return nil
	}
	out := make(chan struct{}, 1)
	go func() {
		defer func() { _ = w.Stop() }()
		defer shared.Recover(r.log, "lease watch", nil) // acquire polls without it
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() == jetstream.KeyValuePut {
					continue // the owner's refreshes: nothing to take
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// acquire waits until this runner holds the account's lease; it returns
// false when the runner stops first.
func (r *accountRunner) acquire(ctx context.Context, l *lease, changed <-chan struct{}) bool {
	var lastErr string
	for {
		var ok bool
		var err error
		if r.svc.share.mayTake(ctx) {
			if ok, err = l.tryAcquire(ctx); ok {
				if l.tookFrom != "" {
					r.log.Info("this process now sends for the account; the previous holder's connection is gone", "previous", l.tookFrom)
				} else {
					r.log.Info("this process now sends for the account")
				}
				return true
			}
			r.svc.share.released()
		}
		if err != nil && ctx.Err() == nil && err.Error() != lastErr {
			r.log.Warn("cannot take the account's lease; retrying", "err", err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-time.After(leaseRefresh):
		}
	}
}

// keepLease refreshes the lease every leaseRefresh until ctx ends. When the
// lease is lost, or cannot be confirmed before it runs out, it ends the
// session.
func (r *accountRunner) keepLease(ctx context.Context, l *lease, end context.CancelCauseFunc) {
	t := time.NewTicker(leaseRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := l.refresh(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		if errors.Is(err, errLeaseLost) || !l.valid() {
			end(errLeaseLost)
			return
		}
		r.log.Warn("could not refresh the account's lease; still valid for a moment", "err", err, "valid_for", time.Until(l.until()).Round(time.Millisecond))
	}
}
