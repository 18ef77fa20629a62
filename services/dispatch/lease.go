package dispatch

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/broadcastd/broadcast/internal/lease"
)

// An account's lease in KV broadcast_leases (package lease) decides which
// dispatch process sends for it: the key is the account, the value the
// runner's owner id. A crashed owner loses the account when the lease
// expires, a killed one as soon as the server has closed its connection
// (lease.Presence); a stopping owner deletes its lease, and another replica
// takes over at once.
//
// A runner waits for its account's lease (watchLease, acquire) and keeps
// it while it sends (keepLease).

// watchLease returns a channel that receives when the account's lease is
// released (nil when the watch cannot start: acquire then only polls).
func (r *accountRunner) watchLease(ctx context.Context) <-chan struct{} {
	released, err := lease.WatchReleased(ctx, r.svc.leases, r.name)
	if err != nil {
		r.log.Warn("cannot watch the account's lease; polling it", "err", err)
	}
	return released
}

// acquire waits until this runner holds the account's lease; it returns
// false when the runner stops first or wanted says it no longer needs to.
func (r *accountRunner) acquire(ctx context.Context, l *lease.Lease, changed <-chan struct{}, wanted func() bool) bool {
	var lastErr string
	for {
		if !wanted() {
			return false
		}
		ok, err := r.tryAcquire(ctx, l)
		if ok {
			return true
		}
		if err != nil && ctx.Err() == nil && err.Error() != lastErr {
			r.log.Warn("cannot take the account's lease; retrying", "err", err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-time.After(lease.Refresh):
		}
	}
}

// tryAcquire takes the lease if this process may hold one more and
// nobody holds it.
func (r *accountRunner) tryAcquire(ctx context.Context, l *lease.Lease) (bool, error) {
	if !r.svc.share.MayTake(ctx) {
		return false, nil
	}
	ok, err := l.TryAcquire(ctx)
	if !ok {
		r.svc.share.Released()
		return false, err
	}
	if l.TookFrom != "" {
		r.log.Info("this process now sends for the account; the previous holder's connection is gone", "previous", l.TookFrom)
	} else {
		r.log.Info("this process now sends for the account")
	}
	return true, nil
}

// refreshPhase is how long a new session waits for its first refresh: up
// to one period, never less than a tenth of it.
func refreshPhase() time.Duration {
	return lease.Refresh/10 + rand.N(lease.Refresh*9/10)
}

// errReconnected ends a session whose connection was lost meanwhile: the
// server may have restarted, losing the lanes' consumers (their state is
// in memory, consumerConfig), so the next session creates them again.
var errReconnected = errors.New("the connection to the server was lost")

// keepLease refreshes the lease every lease.Refresh until ctx ends. When the
// lease is lost, or cannot be confirmed before it runs out, or the
// connection was lost since the session began, it ends the session.
//
// The first refresh comes after a random part of the period: a task over
// many sleeping accounts wakes them together, and refreshes in step would
// reach the server as one burst a period (a thousand updates queued behind
// each other, the last confirmed late).
func (r *accountRunner) keepLease(ctx context.Context, l *lease.Lease, end context.CancelCauseFunc) {
	t := time.NewTimer(refreshPhase())
	defer t.Stop()
	_, losses := r.svc.conn.State()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(lease.Refresh)
		}
		if _, n := r.svc.conn.State(); n != losses {
			end(errReconnected)
			return
		}
		began := time.Now()
		err := l.Refresh(ctx)
		r.svc.cfg.metrics.LeaseRefreshed(time.Since(began))
		if err == nil || ctx.Err() != nil {
			continue
		}
		if errors.Is(err, lease.ErrLost) || !l.Valid() {
			end(lease.ErrLost)
			return
		}
		r.log.Warn("could not refresh the account's lease; still valid for a moment", "err", err, "valid_for", time.Until(l.Until()).Round(time.Millisecond))
	}
}
