package render

import (
	"context"
	"fmt"
	"strings"

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
	s.log.Warn("no enabled account for task; batch waits", shared.KeyTaskID, t.ID, "channel", t.Channel, "reason", reason)
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
