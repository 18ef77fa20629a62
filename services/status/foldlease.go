package status

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/shared"
)

// Any number of status processes may run; one folds each partition of
// the tasks (partition.go), holding the partition's lease in KV
// broadcast_leases (contract.StatusFoldLease with one partition), and the
// others stand by for it (they serve the dashboard all the same). Two
// folders of a partition would each see part of its events and write
// progress from their part. A stopping holder
// flushes, acknowledges and releases the lease, and a standby (watching
// the key) takes over at once; a killed holder's lease is taken as soon as
// the server has closed its connection (lease.Presence), and its process
// stops counting toward the fair share then (lease.FairShare.Gone); the
// events it had not acknowledged come back to the new holder after the
// consumer's ack wait, to be folded onto the checkpoints. A holder writes a checkpoint or
// a progress value only while its lease is valid (partition.mayWrite), so progress
// stays monotonic across a take-over.

// foldLease prepares this process's claims on the partitions' leases (a
// function making the claim on a key) and answers on its alive subject;
// the returned function stops answering. With several partitions it also
// sets up the fair share they are spread by.
func (s *Service) foldLease(ctx context.Context) (func(key string) *lease.Lease, func(), error) {
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
	if len(s.parts) > 1 {
		s.share = lease.NewFairShare(kv, statusReplicaPrefix, func() int { return len(s.parts) })
		replica = s.share.Replica
	}
	presence := lease.NewPresence(s.js.Conn(), "status")
	s.presence = presence
	if s.share != nil {
		s.share.ReplicaGone = presence.Gone
	}
	stop, err := presence.Answer(replica, s.log)
	if err != nil {
		return nil, nil, fmt.Errorf("alive subject: %w", err)
	}
	conn := lease.WatchConn(s.js.Conn())
	return func(key string) *lease.Lease {
		l := lease.New(kv, key, st.TTL())
		l.Owner = lease.OwnerID(replica)
		l.HolderGone, l.Conn = presence.Gone, conn.State
		return l
	}, stop, nil
}

// statusReplicaPrefix starts the keys status processes announce
// themselves under in KV broadcast_leases for the fair share.
const statusReplicaPrefix = "status-replica."

// errNotConfirmed stops a flush while the fold lease is not confirmed
// valid; its events stay unacknowledged and their effect in memory.
var errNotConfirmed = errors.New("fold lease not confirmed")

// mayWriteShared reports whether this process does the work of the
// whole fold that is not by task (old tasks' removal, the accounts'
// scores): it holds partition 0.
func (s *Service) mayWriteShared() bool { return s.parts[0].mayWrite() }

// watchFoldLease returns a channel that receives when p's lease is
// released (nil when the watch cannot start: acquireFold then only polls).
func (s *Service) watchFoldLease(ctx context.Context, p *partition, log *slog.Logger) <-chan struct{} {
	released, err := lease.WatchReleased(ctx, s.leases, p.leaseKey)
	if err != nil {
		log.Warn("cannot watch the fold lease; polling it", "err", err)
	}
	return released
}

// acquireFold waits until this process holds p's lease, l, within its
// fair share; it returns false when ctx ends first.
func (s *Service) acquireFold(ctx context.Context, p *partition, l *lease.Lease, released <-chan struct{}, log *slog.Logger) bool {
	var lastErr, lastForeign string
	standing := false
	for {
		ok, err := s.tryFold(ctx, l, &lastForeign, log)
		if ok {
			if l.TookFrom != "" {
				log.Info("this process now folds the events; the previous holder's connection is gone", "previous", l.TookFrom)
			} else {
				log.Info("this process now folds the events")
			}
			return true
		}
		if err != nil && ctx.Err() == nil && err.Error() != lastErr {
			log.Warn("cannot take the fold lease; retrying", "err", err)
			lastErr = err.Error()
		}
		if !standing && err == nil {
			log.Info("another status process folds the events; standing by")
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

// tryFold takes l unless a live process holds it, this process holds its
// share of the partitions, or status processes of another partition count
// fold (foreignLayout, logged once per key in lastForeign).
func (s *Service) tryFold(ctx context.Context, l *lease.Lease, lastForeign *string, log *slog.Logger) (bool, error) {
	free, gone, err := s.leaseState(ctx, l)
	if err != nil || !free && gone == "" {
		return false, err
	}
	if s.share != nil {
		if gone != "" {
			// A killed holder's replica no longer counts toward the share,
			// so the partitions it leaves stay with the replicas left.
			s.share.Gone(gone)
		}
		if !s.share.MayTake(ctx) {
			if gone == "" {
				return false, nil
			}
			// A killed holder's partition is taken at once, beyond the
			// share if need be; the share hands it on to a live replica
			// holding fewer.
			s.share.TakeBeyond()
		}
	}
	ok, err := s.tryFoldLayout(ctx, l, lastForeign, log)
	if !ok && s.share != nil {
		s.share.Released()
	}
	return ok, err
}

// tryFoldLayout takes l unless status processes of another partition
// count fold.
func (s *Service) tryFoldLayout(ctx context.Context, l *lease.Lease, lastForeign *string, log *slog.Logger) (bool, error) {
	foreign, err := s.foreignLayout(ctx)
	if err != nil {
		return false, err
	}
	if foreign != "" {
		if foreign != *lastForeign {
			log.Error("a status process with another STATUS_PARTITIONS folds; all must have the same; standing by until it stops",
				"partitions", len(s.parts), "foreign_lease", foreign)
			*lastForeign = foreign
		}
		return false, nil
	}
	*lastForeign = ""
	return l.TryAcquire(ctx)
}

// leaseState reads l's key: free (no holder, or this holder), or held by
// gone, a holder whose connection the server says is gone ("" if none).
func (s *Service) leaseState(ctx context.Context, l *lease.Lease) (free bool, gone string, err error) {
	gctx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	e, err := s.leases.Get(gctx, l.Key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return true, "", nil
	}
	if err != nil {
		return false, "", err
	}
	if holder := string(e.Value()); holder != l.Owner {
		if s.presence.Gone(gctx, holder) {
			return false, holder, nil
		}
		return false, "", nil
	}
	return true, "", nil
}

// keepFoldLease refreshes the lease every lease.Refresh until ctx ends; a
// lease someone else holds now, or that ran out, ends the session. While
// it cannot be confirmed (the connection is down) nothing is written
// (partition.mayWrite), but the fold state is kept: after a reconnect the next
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
