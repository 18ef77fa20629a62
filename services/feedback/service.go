package feedback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// Service is the feedback service.
type Service struct {
	js       jetstream.JetStream
	cfg      Config
	log      *slog.Logger
	accounts *accounts
	index    jetstream.KeyValue
	signals  jetstream.KeyValue // accounts' provider signals (quality.go)
	// suppressions receives opt-outs, holds, bounces and complaints
	// (suppress.go).
	suppressions *suppress.List
	behind       behindCache
	wx           *wxPoller

	addr atomic.Pointer[string]
	// Counters since start, for tests and the benchmark.
	stored, published, unmatched, indexed, polls atomic.Int64
}

// Stats are the service's counters since it started.
type Stats struct {
	// Stored receipts (acknowledged by the server before the provider got 200).
	Stored int64
	// Published receipt events.
	Published int64
	// Unmatched receipts given up on.
	Unmatched int64
	// Indexed sent events.
	Indexed int64
	// Polls are the WxPusher status queries made.
	Polls int64
}

// Stats returns the counters since start.
func (s *Service) Stats() Stats {
	return Stats{Stored: s.stored.Load(), Published: s.published.Load(), Unmatched: s.unmatched.Load(), Indexed: s.indexed.Load(),
		Polls: s.polls.Load()}
}

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Service{js: js, cfg: cfg, log: cfg.Logger.With(shared.KeyService, "feedback"),
		accounts: newAccounts(cfg.Getenv, cfg.SecretEnvs), wx: newWxPoller(cfg.WxPusherRate)}, nil
}

// Addr is the address the webhook routes listen on, "" until Run listens.
func (s *Service) Addr() string {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// Run serves the webhook routes, indexes sent events and turns receipts
// into events until ctx ends. It returns an error when it cannot start
// (the address is taken, a bucket is missing) or a part fails.
func (s *Service) Run(ctx context.Context) error {
	// Each step is tried again while the server restarts (shared.SetUp).
	err := shared.SetUpAll(ctx, s.log,
		shared.Step{What: "buckets", Run: func(ctx context.Context) (err error) {
			if s.signals, err = s.js.KeyValue(ctx, contract.BucketSignals); err != nil {
				return fmt.Errorf("%s: %w", contract.BucketSignals, err)
			}
			if s.index, err = s.js.KeyValue(ctx, contract.BucketProviderIDs); err != nil {
				return err
			}
			s.suppressions, err = suppress.Open(ctx, s.js)
			return err
		}},
		shared.Step{What: "accounts", Run: func(ctx context.Context) (err error) {
			s.accounts.aw, err = shared.WatchAccounts(ctx, s.js, s.log, s.accounts.change)
			return err
		}},
	)
	if err != nil {
		return fmt.Errorf("feedback: %w", err)
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("feedback: listen on %s: %w", s.cfg.Addr, err)
	}
	addr := ln.Addr().String()
	s.addr.Store(&addr)
	if s.cfg.Token == "" {
		s.log.Warn("FEEDBACK_TOKEN is not set: POST /webhooks/bounce refuses every request")
	}
	s.log.Info("feedback started", "url", "http://"+addr+"/webhooks/")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("feedback: %s: %w", name, err)
				cancel()
			}
		})
	}
	run("http", func(ctx context.Context) error { return s.serve(ctx, ln) })
	run("index", func(ctx context.Context) error {
		return s.consume(ctx, s.indexConsumer, s.indexSent, s.cfg.Concurrency)
	})
	run("receipts", func(ctx context.Context) error {
		return s.consume(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return s.js.CreateOrUpdateConsumer(ctx, contract.StreamReceipts, receiptConsumerConfig())
		}, s.handleReceipt, s.cfg.Concurrency)
	})
	run("wxpusher", func(ctx context.Context) error {
		return s.consume(ctx, s.wxConsumer, s.pollSent, wxConcurrency)
	})
	wg.Wait()
	close(errs)
	return <-errs
}

// consume runs h over a durable consumer until ctx ends, creating the
// consumer again when the server lost it.
func (s *Service) consume(ctx context.Context, open func(context.Context) (jetstream.Consumer, error), h shared.Handler, concurrency int) error {
	for {
		var cons jetstream.Consumer
		err := shared.SetUp(ctx, s.log, "consumer", func(ctx context.Context) (err error) {
			cons, err = open(ctx)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consumer: %w", err)
		}
		// The consumers' ack wait is short (10 s), so the receipts a killed
		// process held come back soon; handlers take milliseconds.
		err = shared.Consume(ctx, cons, h, shared.ConsumeConfig{Concurrency: concurrency, AckWait: 10 * time.Second, Logger: s.log})
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, shared.ErrConsumerGone) {
			return err
		}
		s.log.Warn("consumer gone; creating it again")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}
