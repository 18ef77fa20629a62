package ingest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// checkConfigured validates what depends on configuration: the channel
// exists and the task's accounts (or, when it names none, at least one
// account of its channel) are configured. A
// task the accounts view would reject is judged again once the view has
// caught up with the bucket: an account put just before the task (`nats kv
// put`, then `nats pub`) must not be missed.
func (s *Service) checkConfigured(ctx context.Context, t *contract.Task) (channels.Channel, error) {
	ch, err := s.cfg.Channels.Get(t.Channel)
	if err != nil {
		return nil, &contract.FieldError{Field: "channel", Reason: err.Error()}
	}
	if err := s.checkAccounts(t, ch); err != nil {
		if cerr := s.accounts.CatchUp(ctx, 2*time.Second); cerr != nil {
			s.log.Warn("accounts view did not catch up; judging the task on what it has", shared.KeyTaskID, t.ID, "err", cerr)
			return nil, err
		}
		if err := s.checkAccounts(t, ch); err != nil {
			return nil, err
		}
	}
	return ch, nil
}

// checkAccounts checks the task's accounts and test recipients against the
// accounts view as it is.
func (s *Service) checkAccounts(t *contract.Task, ch channels.Channel) error {
	for i, name := range t.Accounts {
		field := fmt.Sprintf("accounts[%d]", i)
		a := s.accounts.Get(name)
		switch {
		case a == nil && s.accounts.Invalid(name) != nil:
			return &contract.FieldError{Field: field, Reason: fmt.Sprintf("account %q is misconfigured: %v", name, s.accounts.Invalid(name))}
		case a == nil:
			return &contract.FieldError{Field: field, Reason: fmt.Sprintf("no account %q in %s", name, contract.BucketAccounts)}
		case a.Channel != t.Channel:
			return &contract.FieldError{Field: field, Reason: fmt.Sprintf("account %q is a %s account, task channel is %s", name, a.Channel, t.Channel)}
		}
	}
	// A disabled account is an operator's pause, not a mistake in the
	// task: a task whose accounts are all disabled is accepted and waits
	// for one to be enabled (render holds its batches and says why).
	if len(t.Accounts) == 0 && !slices.ContainsFunc(s.accounts.All(), func(a *contract.Account) bool { return a.Channel == t.Channel }) {
		return &contract.FieldError{Field: "channel", Reason: fmt.Sprintf("no %s account in %s", t.Channel, contract.BucketAccounts)}
	}
	for i, r := range t.TestRecipients {
		if _, err := ch.NormalizeRecipient(r.To); err != nil {
			return &contract.FieldError{Field: fmt.Sprintf("test_recipients[%d].to", i), Reason: err.Error()}
		}
	}
	return nil
}
