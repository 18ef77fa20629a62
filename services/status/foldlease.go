package status

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/shared"
)

// Any number of status processes may run; one folds, holding the lease
// contract.StatusFoldLease in KV broadcast_leases, and the others stand by
// (they serve the dashboard all the same). Two folders would each see part
// of the events and write progress from their part. A stopping holder
// flushes, acknowledges and releases the lease, and a standby (watching
// the key) takes over at once; a killed holder's lease is taken as soon as
// the server has closed its connection (lease.Presence), and the events it
// had not acknowledged come back to the new holder after the consumer's ack
// wait, to be folded onto the checkpoints. A holder writes a checkpoint or
// a progress value only while its lease is valid (mayWrite), so progress
// stays monotonic across a take-over.

// foldLease prepares this process's claim on the fold lease and answers on
// its alive subject; the returned function stops answering.
func (s *Service) foldLease(ctx context.Context) (*lease.Lease, func(), error) {
	kv, err := s.js.KeyValue(ctx, contract.BucketLeases)
	if err != nil {
		return nil, nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, nil, err
	}
	if st.TTL() <= lease.Margin+lease.Refresh {
		return nil, nil, fmt.Errorf("bucket %s has TTL %s; leases need one above %s (shared.LeaseTTL is %s)",
			contract.BucketLeases, st.TTL(), lease.Margin+lease.Refresh, shared.LeaseTTL)
	}
	s.leases = kv
	replica := lease.NewReplicaID()
	presence := lease.NewPresence(s.js.Conn(), "status")
	stop, err := presence.Answer(replica, s.log)
	if err != nil {
		return nil, nil, fmt.Errorf("alive subject: %w", err)
	}
	l := lease.New(kv, contract.StatusFoldLease, st.TTL())
	l.Owner = lease.OwnerID(replica)
	l.HolderGone, l.Conn = presence.Gone, lease.WatchConn(s.js.Conn()).State
	return l, stop, nil
}

// errNotConfirmed stops a flush while the fold lease is not confirmed
// valid; its events stay unacknowledged and their effect in memory.
var errNotConfirmed = errors.New("fold lease not confirmed")

// mayWrite reports whether this process may write progress and
// checkpoints now: it holds a valid fold lease.
func (s *Service) mayWrite() bool {
	l := s.holds.Load()
	return l != nil && l.Valid()
}

// watchFoldLease returns a channel that receives when the fold lease is
// released (nil when the watch cannot start: acquireFold then only polls).
func (s *Service) watchFoldLease(ctx context.Context) <-chan struct{} {
	released, err := lease.WatchReleased(ctx, s.leases, contract.StatusFoldLease)
	if err != nil {
		s.log.Warn("cannot watch the fold lease; polling it", "err", err)
	}
	return released
}

// acquireFold waits until this process holds the fold lease; it returns
// false when ctx ends first.
func (s *Service) acquireFold(ctx context.Context, l *lease.Lease, released <-chan struct{}) bool {
	var lastErr string
	standing := false
	for {
		ok, err := l.TryAcquire(ctx)
		if ok {
			if l.TookFrom != "" {
				s.log.Info("this process now folds the events; the previous holder's connection is gone", "previous", l.TookFrom)
			} else {
				s.log.Info("this process now folds the events")
			}
			return true
		}
		if err != nil && ctx.Err() == nil && err.Error() != lastErr {
			s.log.Warn("cannot take the fold lease; retrying", "err", err)
			lastErr = err.Error()
		}
		if !standing && err == nil {
			s.log.Info("another status process folds the events; standing by")
			standing = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-released:
		case <-time.After(lease.Refresh):
		}
	}
}

// keepFoldLease refreshes the lease every lease.Refresh until ctx ends; a
// lease someone else holds now, or that ran out, ends the session. While
// it cannot be confirmed (the connection is down) nothing is written
// (mayWrite), but the fold state is kept: after a reconnect the next
// refresh confirms the lease again and the held events are written.
func (s *Service) keepFoldLease(ctx context.Context, l *lease.Lease, end context.CancelCauseFunc) {
	t := time.NewTicker(lease.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := l.Refresh(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		if errors.Is(err, lease.ErrLost) {
			l.Drop()
			end(lease.ErrLost)
			return
		}
		s.log.Warn("could not refresh the fold lease; writing nothing until it is confirmed", "err", err)
	}
}
