package dispatch

import (
	"context"
	"errors"
	"strconv"
	"strings"

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
	s.adoptOrphans(ctx)
	shared.Every(ctx, s.cfg.ReapInterval, func(ctx context.Context) {
		s.adoptOrphans(ctx)
		s.reapDeleted(ctx)
	})
}

// adoptOrphans starts a runner for every account that has jobs in its
// lanes but no runner and no valid value in broadcast_accounts: one deleted
// while no dispatch ran, or while the process moving its jobs died, whose
// jobs nothing else would move. Like a deleted account's runner it
// only moves the jobs to healthy accounts of their pool; the reaper stops
// it once nothing is left. It returns how many it started.
func (s *Service) adoptOrphans(ctx context.Context) int {
	stream, err := s.js.Stream(ctx, contract.StreamJobs)
	if err != nil {
		return 0
	}
	// Lanes are one subject per account and priority: few, whatever the
	// number of jobs.
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectJobsPrefix+">"))
	if err != nil {
		s.log.Debug("could not list the job lanes", "err", err)
		return 0
	}
	n := 0
	for subject := range info.State.Subjects {
		rest, _ := strings.CutPrefix(subject, contract.SubjectJobsPrefix)
		account, _, _ := strings.Cut(rest, ".")
		s.mu.Lock()
		running := s.runners[account] != nil
		s.mu.Unlock()
		if running || !contract.ValidID(account) || s.accounts.Get(account) != nil {
			continue
		}
		m, err := stream.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			continue
		}
		var job contract.Job
		if err := contract.DecodeJob(contract.SplitJobs(m.Data)[0], &job); err != nil || job.Channel == "" {
			continue
		}
		if s.adopt(account, job.Channel) {
			n++
		}
	}
	return n
}

// adopt starts a disabled runner for an account that is not in
// broadcast_accounts, marked deleted, so that it moves its queued jobs
// away. It sends nothing, so it needs no sender.
func (s *Service) adopt(account, channel string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runners[account] != nil || s.accounts.Get(account) != nil || s.ctx.Err() != nil {
		return false
	}
	acct, err := contract.DecodeAccount(account, []byte(`{"channel":`+strconv.Quote(channel)+`,"enabled":false}`))
	if err != nil {
		s.log.Warn("jobs queued for an unknown account of an unusable channel; left where they are", shared.KeyAccount, account, "err", err)
		return false
	}
	r := newAccountRunner(s.ctx, s, acct, nil)
	s.runners[account] = r
	s.deletedAccounts[account] = true
	s.numRunners.Store(int32(len(s.runners)))
	s.wg.Go(r.run)
	s.log.Warn("jobs queued for an account that is not in broadcast_accounts; moving them to healthy accounts",
		shared.KeyAccount, account, "channel", channel)
	return true
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
		if err := s.asleepKV.Delete(ctx, name); err != nil {
			s.log.Debug("could not take down a deleted account's asleep mark", shared.KeyAccount, name, "err", err)
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
