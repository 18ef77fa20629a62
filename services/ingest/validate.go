package ingest

import (
	"fmt"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// checkConfigured validates what depends on configuration: the channel
// exists and the task has at least one enabled account of that channel.
func (s *Service) checkConfigured(t *contract.Task) (channels.Channel, error) {
	ch, err := s.cfg.Channels.Get(t.Channel)
	if err != nil {
		return nil, &contract.FieldError{Field: "channel", Reason: err.Error()}
	}
	for i, name := range t.Accounts {
		field := fmt.Sprintf("accounts[%d]", i)
		a := s.accounts.Get(name)
		switch {
		case a == nil && s.accounts.Invalid(name) != nil:
			return nil, &contract.FieldError{Field: field, Reason: fmt.Sprintf("account %q is misconfigured: %v", name, s.accounts.Invalid(name))}
		case a == nil:
			return nil, &contract.FieldError{Field: field, Reason: fmt.Sprintf("no account %q in %s", name, contract.BucketAccounts)}
		case a.Channel != t.Channel:
			return nil, &contract.FieldError{Field: field, Reason: fmt.Sprintf("account %q is a %s account, task channel is %s", name, a.Channel, t.Channel)}
		}
	}
	if len(s.accounts.ForTask(t.Channel, t.Accounts)) == 0 {
		field := "channel"
		if len(t.Accounts) > 0 {
			field = "accounts"
		}
		return nil, &contract.FieldError{Field: field, Reason: fmt.Sprintf("no enabled %s account in %s", t.Channel, contract.BucketAccounts)}
	}
	for i, r := range t.TestRecipients {
		if _, err := ch.NormalizeRecipient(r.To); err != nil {
			return nil, &contract.FieldError{Field: fmt.Sprintf("test_recipients[%d].to", i), Reason: err.Error()}
		}
	}
	return ch, nil
}
