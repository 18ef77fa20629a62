package render

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// maxNamedInReason is how many of the task's accounts the waiting reason
// names; a longer list is counted, to keep progress small.
const maxNamedInReason = 5

// waitForAccount holds a batch whose task has no enabled account: it says
// so in a task-level retrying event (the events stream keeps one per
// duplicate window) and asks for the batch again after NoAccountRetry.
func (s *Service) waitForAccount(ctx context.Context, t *contract.Task) error {
	reason := fmt.Sprintf("no enabled %s account", t.Channel)
	switch n := len(t.Accounts); {
	case n > maxNamedInReason:
		reason = fmt.Sprintf("no enabled account among the task's %d accounts", n)
	case n > 0:
		reason = fmt.Sprintf("no enabled account among %s", strings.Join(t.Accounts, ", "))
	}
	if s.waits.due(t.ID, reason, time.Now()) {
		s.log.Warn("no enabled account for task; its batches wait", shared.KeyTaskID, t.ID, "channel", t.Channel, "reason", reason)
	}
	f, err := s.pub.PublishEvent(ctx, &contract.Event{
		TaskID: t.ID, Kind: contract.EventRetrying, Index: -1,
		Code: contract.CodeNoEnabledAccount, Error: reason, Class: contract.ClassRetryable,
	})
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return shared.RetryAfter(s.cfg.NoAccountRetry, shared.ErrNoAccount)
}

// waitLogInterval is how often a waiting task's warning repeats: every
// batch of a task asks again after NoAccountRetry, and a task of 1,000
// batches warned 200 times a second.
const waitLogInterval = time.Minute

// waitLog remembers when each waiting task was last warned about.
type waitLog struct {
	mu   sync.Mutex
	last map[string]waitLogged
}

type waitLogged struct {
	at     time.Time
	reason string
}

// due reports whether the task's wait should be logged now: the first
// time, when its reason changed, or waitLogInterval after the last.
func (w *waitLog) due(task, reason string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[string]waitLogged{}
	}
	if l, ok := w.last[task]; ok && l.reason == reason && now.Sub(l.at) < waitLogInterval {
		return false
	}
	for id, l := range w.last {
		if now.Sub(l.at) > 10*waitLogInterval {
			delete(w.last, id) // tasks long past waiting
		}
	}
	w.last[task] = waitLogged{at: now, reason: reason}
	return true
}
