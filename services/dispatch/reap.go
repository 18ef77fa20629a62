package dispatch

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// runReaper stops, until ctx ends, the runners of accounts deleted from
// broadcast_accounts once nothing of theirs is left to move: no job in
// their lanes, none delayed or held for them. A deleted account's runner
// moves its queued jobs to healthy accounts (as a disabled one does) and
// then, without this, stayed with its goroutines and three consumers for
// as long as the process ran.
func (s *Service) runReaper(ctx context.Context) {
	shared.Every(ctx, s.cfg.ReapInterval, func(ctx context.Context) { s.reapDeleted(ctx) })
}

// reapDeleted stops the deleted accounts' runners with nothing left.
func (s *Service) reapDeleted(ctx context.Context) int {
	s.mu.Lock()
	var deleted []string
	for name := range s.deletedAccounts {
		deleted = append(deleted, name)
	}
	s.mu.Unlock()
	n := 0
	for _, name := range deleted {
		if !s.accountEmpty(ctx, name) {
			continue
		}
		s.mu.Lock()
		r := s.runners[name]
		if r == nil || !s.deletedAccounts[name] {
			s.mu.Unlock()
			continue // re-created meanwhile
		}
		r.stop()
		delete(s.runners, name)
		delete(s.deletedAccounts, name)
		s.numRunners.Store(int32(len(s.runners)))
		s.mu.Unlock()
		for _, p := range contract.Priorities {
			if err := s.js.DeleteConsumer(ctx, contract.StreamJobs, contract.DispatchConsumer(name, p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				s.log.Debug("could not delete a deleted account's consumer", shared.KeyAccount, name, "err", err)
			}
		}
		s.log.Info("deleted account's runner stopped: nothing of it is left to move", shared.KeyAccount, name)
		n++
	}
	return n
}

// accountEmpty reports whether no job of account is queued, in flight,
// delayed or held.
func (s *Service) accountEmpty(ctx context.Context, account string) bool {
	stream, err := s.js.Stream(ctx, contract.StreamJobs)
	if err != nil {
		return false
	}
	for _, filter := range []string{contract.JobsFilter(account), contract.SubjectDelayPrefix + account + ".>"} {
		// The last message on the filter says whether there is any, without
		// listing (possibly a million) subjects.
		if _, err := stream.GetLastMsgForSubject(ctx, filter); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
	}
	for _, p := range contract.Priorities {
		c, err := s.js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer(account, p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
			return false
		}
	}
	return true
}
