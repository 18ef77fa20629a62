package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// Service is the dispatch service: one runner per enabled account.
type Service struct {
	js     jetstream.JetStream
	cfg    Config
	log    *slog.Logger
	ledger jetstream.KeyValue

	mu      sync.Mutex
	runners map[string]*accountRunner
	ctx     context.Context
	wg      sync.WaitGroup
}

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Service{js: js, cfg: cfg, log: cfg.Logger.With(shared.KeyService, "dispatch"), runners: map[string]*accountRunner{}}, nil
}

// Run dispatches until ctx is cancelled, then lets in-flight sends finish.
func (s *Service) Run(ctx context.Context) error {
	var err error
	if s.ledger, err = s.js.KeyValue(ctx, shared.BucketLedger); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	s.ctx = ctx
	if _, err := shared.WatchAccounts(ctx, s.js, s.log, s.accountChanged); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	s.log.Info("dispatch started")
	<-ctx.Done()
	s.mu.Lock()
	for _, r := range s.runners {
		r.stop()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// accountChanged applies an edit of broadcast_accounts: pacing changes apply
// in place; concurrency, channel or endpoint changes restart the account's
// consumer; disabled or deleted accounts stop.
func (s *Service) accountChanged(c shared.AccountChange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.log.With(shared.KeyAccount, c.Name)
	old := s.runners[c.Name]
	if c.Account == nil || !c.Account.IsEnabled() {
		if old != nil {
			log.Info("account stopped (disabled, deleted or invalid)")
			old.stop()
			delete(s.runners, c.Name)
		}
		return
	}
	ch, err := s.cfg.Channels.Get(c.Account.Channel)
	if err != nil {
		log.Error("account has an unknown channel; not started", "err", err)
		return
	}
	sender, err := ch.NewSender(c.Account, s.cfg.Getenv)
	if err != nil {
		log.Error("account misconfigured; not started", "err", err)
		if old != nil {
			old.stop()
			delete(s.runners, c.Name)
		}
		return
	}
	if old != nil && old.canUpdateInPlace(c.Account) {
		old.update(c.Account, sender)
		log.Info("account updated", "rate_per_sec", c.Account.RatePerSec, "burst", c.Account.Burst)
		return
	}
	if old != nil {
		old.stop()
	}
	r := newAccountRunner(s.ctx, s, c.Account, sender)
	s.runners[c.Name] = r
	s.wg.Go(r.run)
	log.Info("account started", "channel", c.Account.Channel, "rate_per_sec", c.Account.RatePerSec,
		"burst", c.Account.Burst, "concurrency", c.Account.Concurrency)
}
