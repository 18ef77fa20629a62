package dispatch

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// wakeDebounce gathers the account edits of a moment (a script editing
// several accounts) into one pass over the held jobs.
const wakeDebounce = 200 * time.Millisecond

// addsCapacity reports whether an account edit may let held jobs of its
// channel go: a new account, one enabled again, a paused one edited (the
// edit clears the pause), or a daily cap raised or removed.
func addsCapacity(old *accountRunner, acct *contract.Account) bool {
	if old == nil {
		return true
	}
	old.mu.RLock()
	prev, paused := old.acct, old.paused
	old.mu.RUnlock()
	if paused || !prev.IsEnabled() && acct.IsEnabled() {
		return true
	}
	now, sig := time.Now(), old.svc.signals.Get(acct.Name)
	before, after := accountLimits(prev, sig, 0, now).own, accountLimits(acct, sig, 0, now).own
	return before > 0 && (after == 0 || after > before) || prev.Portfolio != acct.Portfolio
}

// wakeLater asks the waker to wake the held jobs of channel's accounts.
func (s *Service) wakeLater(channel string) {
	s.wakeMu.Lock()
	s.wakeChannels[channel] = true
	s.wakeMu.Unlock()
	select {
	case s.wakeSignal <- struct{}{}:
	default:
	}
}

// runWaker wakes held jobs when asked until ctx ends.
func (s *Service) runWaker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wakeSignal:
		}
		if sleep(ctx, wakeDebounce) != nil {
			return
		}
		s.wakeMu.Lock()
		chans := s.wakeChannels
		s.wakeChannels = map[string]bool{}
		s.wakeMu.Unlock()
		s.mu.Lock()
		var names []string
		for name, r := range s.runners {
			if a, _ := r.current(); chans[a.Channel] {
				names = append(names, name)
			}
		}
		s.mu.Unlock()
		for _, name := range names {
			n, err := s.wakeHeld(ctx, name)
			if err != nil && ctx.Err() == nil {
				// Another replica may be waking the same account (a work
				// queue allows one consumer per subject); the jobs still come
				// back when their schedule fires.
				s.log.Debug("could not wake held jobs", shared.KeyAccount, name, "err", err)
			}
			if n > 0 {
				s.log.Info("held jobs woken by an account edit", shared.KeyAccount, name, "count", n)
			}
		}
	}
}

// wakeHeld puts the jobs held on account (holdJob) back in its queue now,
// where dispatch checks their caps and health again, and cancels their
// schedules.
func (s *Service) wakeHeld(ctx context.Context, account string) (int, error) {
	return s.takeAll(ctx, contract.HeldFilter(account), func(m jetstream.Msg) error {
		var job contract.Job
		if err := contract.DecodeJob(m.Data(), &job); err != nil {
			// Not a job dispatch wrote: leave it to its schedule, where the
			// consume loop dead-letters it like any undecodable job.
			return errSkip
		}
		return s.requeueCopy(ctx, m, &job, "wake")
	})
}
