package shared

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Handler processes one message. It never acknowledges by hand: it returns
// nil, Permanent(err) or RetryAfter(d, err) and the loop acts on that.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// DeadLetterFunc keeps a message the handler gave up on (for example by
// publishing it to DEAD). If it fails the message is retried, never lost.
type DeadLetterFunc func(ctx context.Context, msg jetstream.Msg, cause error) error

// ConsumeConfig tunes Consume.
type ConsumeConfig struct {
	// Concurrency is how many messages are handled at once; it is also the
	// client buffer, so buffered messages never exceed the consumer's
	// MaxAckPending when both are equal. Defaults to 1.
	Concurrency int
	// RetryDelay is the NAK delay for plain errors. Defaults to 1 second.
	RetryDelay time.Duration
	// AckWait is the consumer's ack wait; while a handler runs longer than
	// half of it the loop tells the server the message is in progress.
	// Defaults to 30 seconds.
	AckWait time.Duration
	// DeadLetter is called before a permanently failed message is
	// terminated. Defaults to none (the message is just terminated, logged).
	DeadLetter DeadLetterFunc
	// StopGrace is how long in-flight handlers may run after ctx is
	// cancelled before their own context is cancelled. Defaults to 10 seconds.
	StopGrace time.Duration
	// PullOptions are added to the Consume call (e.g. a priority group).
	PullOptions []jetstream.PullConsumeOpt
	Logger      *slog.Logger
}

func (c *ConsumeConfig) withDefaults() {
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = time.Second
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Consume runs h over the consumer's messages until ctx is cancelled, then
// stops pulling and waits for in-flight handlers to finish. Messages still
// buffered but not started are left unacknowledged and are redelivered.
func Consume(ctx context.Context, cons jetstream.Consumer, h Handler, cfg ConsumeConfig) error {
	cfg.withDefaults()
	work := make(chan jetstream.Msg)
	opts := append([]jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(cfg.Concurrency),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, context.Canceled) {
				cfg.Logger.Debug("consume", "err", err)
				return
			}
			cfg.Logger.Warn("consume error", "err", err)
		}),
	}, cfg.PullOptions...)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-ctx.Done():
			// Stopping: hand the message back now rather than let it hold a
			// MaxAckPending slot until its ack wait runs out.
			_ = m.Nak()
		}
	}, opts...)
	if err != nil {
		return err
	}

	// Handlers get their own context so a stop lets them finish their
	// current message (within StopGrace) instead of abandoning a send.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-work:
					handleOne(hctx, m, h, &cfg)
				}
			}
		})
	}
	<-ctx.Done()
	cc.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.StopGrace):
		hcancel()
		<-done
	}
	return nil
}

func handleOne(ctx context.Context, m jetstream.Msg, h Handler, cfg *ConsumeConfig) {
	// Keep long handlers (rate-limit waits, slow providers) from being
	// redelivered under their feet.
	var keepAlive *time.Timer
	interval := cfg.AckWait / 2
	keepAlive = time.AfterFunc(interval, func() {
		_ = m.InProgress()
		keepAlive.Reset(interval)
	})
	err := safeHandle(ctx, m, h)
	keepAlive.Stop()
	Settle(ctx, m, err, cfg)
}

// safeHandle turns a handler panic into a retry so no input crashes a service.
func safeHandle(ctx context.Context, m jetstream.Msg, h Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = RetryAfter(30*time.Second, errors.New("handler panic: "+slogValue(r)))
		}
	}()
	return h(ctx, m)
}

// Settle acknowledges m according to err, as described on Handler.
func Settle(ctx context.Context, m jetstream.Msg, err error, cfg *ConsumeConfig) {
	if err == nil {
		if aerr := m.Ack(); aerr != nil {
			settleLogger(m, cfg).Warn("ack failed; message will be redelivered", "err", aerr)
		}
		return
	}
	switch {
	case IsPermanent(err):
		log := settleLogger(m, cfg)
		if cfg.DeadLetter != nil {
			if derr := cfg.DeadLetter(ctx, m, err); derr != nil {
				log.Error("dead-letter failed; retrying the message instead", "err", derr, "cause", err)
				_ = m.NakWithDelay(cfg.RetryDelay)
				return
			}
		} else {
			log.Error("message given up", "err", err)
		}
		_ = m.Term()
	default:
		delay, ok := RetryDelay(err)
		if !ok {
			delay = cfg.RetryDelay
			settleLogger(m, cfg).Warn("handler failed; will retry", "err", err, "delay", delay)
		}
		_ = m.NakWithDelay(delay)
	}
}

// settleLogger names the message in what Settle logs. It is built only
// when there is something to log: on the success path it cost 3% of the
// benchmark's CPU (slog.With formats its attributes at once).
func settleLogger(m jetstream.Msg, cfg *ConsumeConfig) *slog.Logger {
	log := cfg.Logger.With(KeySubject, m.Subject())
	if meta, err := m.Metadata(); err == nil {
		log = log.With(KeySeq, meta.Sequence.Stream)
	}
	return log
}
