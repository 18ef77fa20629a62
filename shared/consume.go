package shared

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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
	// LeftAtStop, when set, is told of each delivery that came after the
	// stop began and that no handler saw, before it is handed back: dispatch
	// records it in the job's ledger, whose delivery counts tell a job that
	// died in its provider call from one never begun.
	LeftAtStop func(ctx context.Context, m jetstream.Msg)
	// PullOptions are added to the Consume call (e.g. a priority group).
	PullOptions []jetstream.PullConsumeOpt
	Logger      *slog.Logger

	// hold keeps the NAKs of a stopping loop until its subscription ended.
	hold *stopHold
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
// stops pulling and waits for in-flight handlers to finish. Messages
// delivered but not started are handed back (NAKed) once the subscription
// has ended, as are those the handlers hand back from then on (stopHold). It
// returns ErrConsumerGone, after the same wait, when the consumer no
// longer exists on the server.
func Consume(ctx context.Context, cons jetstream.Consumer, h Handler, cfg ConsumeConfig) error {
	cfg.withDefaults()
	// maybeGone is poked when a pull request finds nobody serving the
	// consumer: it may no longer exist (deleted, or held in memory by a
	// server that restarted).
	maybeGone := make(chan struct{}, 1)
	opts := append([]jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(cfg.Concurrency),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, context.Canceled) {
				cfg.Logger.Debug("consume", "err", err)
				return
			}
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				select {
				case maybeGone <- struct{}{}:
				default:
				}
			}
			cfg.Logger.Warn("consume error", "err", err)
		}),
	}, cfg.PullOptions...)
	// Handlers get their own context so a stop lets them finish their
	// current message (within StopGrace) instead of abandoning a send.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	cfg.hold = &stopHold{stopping: ctx, leftAtStop: cfg.LeftAtStop, ctx: hctx}
	running := newInFlight()
	// Messages whose handler returned Later, settled in that order by one
	// goroutine.
	settleLater := make(chan deferred, cfg.Concurrency)
	var settler sync.WaitGroup
	settler.Go(func() {
		for d := range settleLater {
			Settle(hctx, d.m, safeWait(hctx, d.wait), &cfg)
		}
	})
	pool := newWorkers(cfg.Concurrency, func(m jetstream.Msg, slot *inFlightSlot) {
		running.start(slot, m)
		err := safeHandle(hctx, m, h)
		running.end(slot)
		var l *later
		if errors.As(err, &l) {
			settleLater <- deferred{m: m, wait: l.wait}
			return
		}
		Settle(hctx, m, err, &cfg)
	}, running)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if !pool.give(ctx, m) {
			// Stopping: hand the message back once the subscription ended
			// (stopHold) rather than let it hold a MaxAckPending slot until
			// its ack wait runs out.
			_ = cfg.hold.nak(m, 0, true)
		}
	}, opts...)
	if err != nil {
		pool.close()
		close(settleLater)
		settler.Wait()
		return err
	}
	keepCtx, stopKeeping := context.WithCancel(context.WithoutCancel(ctx))
	var keeper sync.WaitGroup
	keeper.Go(func() { running.keepAlive(keepCtx, cfg.AckWait/2) })
	gone := waitStopOrGone(ctx, cons, maybeGone)
	// Drained, not stopped: the messages already in the client's buffer
	// reach the callback, which hands them back, rather than being
	// dropped there to come back only after their ack wait.
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(subscriptionEndWait):
		cfg.Logger.Debug("the subscription did not end in time; handing its messages back anyway")
	}
	cfg.hold.release()
	done := make(chan struct{})
	go func() {
		pool.close()
		close(settleLater)
		settler.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(cfg.StopGrace):
		hcancel()
		<-done
	}
	stopKeeping()
	keeper.Wait()
	if gone {
		return ErrConsumerGone
	}
	return nil
}

// subscriptionEndWait bounds how long a stop waits for the subscription to
// end before it hands back the messages it holds.
const subscriptionEndWait = 2 * time.Second

// ErrConsumerGone ends Consume when its consumer no longer exists on the
// server (deleted, or kept in memory by a server that restarted): the
// caller creates it again.
var ErrConsumerGone = errors.New("the consumer no longer exists")

// waitStopOrGone waits until ctx ends (false) or the server confirms that
// cons no longer exists after a pull found nobody serving it (true).
func waitStopOrGone(ctx context.Context, cons jetstream.Consumer, maybeGone <-chan struct{}) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-maybeGone:
			// Ask until the server answers either way (a restarting
			// server answers neither for a moment).
			for range 20 {
				ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := cons.Info(ictx)
				cancel()
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					return true
				}
				if err == nil || ctx.Err() != nil {
					break
				}
				select {
				case <-ctx.Done():
					return false
				case <-time.After(500 * time.Millisecond):
				}
			}
		}
	}
}

// inFlight is the message each handler goroutine is working on, so that
// one ticker can tell the server about long handlers (rate-limit waits,
// slow providers) before their ack wait runs out and they are redelivered
// under their feet. A timer per message did the same at ten times the
// cost: 2% of the benchmark's CPU.
type inFlight struct {
	mu    sync.Mutex
	slots map[*inFlightSlot]bool // one per running worker
	// busy counts the slots in use; wake tells keepAlive, idle while busy
	// is zero (a consumer with nothing to do costs no wakeups), that one is.
	busy atomic.Int32
	wake chan struct{}
}

type inFlightSlot struct {
	mu    sync.Mutex
	m     jetstream.Msg
	since time.Time // start, or the last progress report
}

func newInFlight() *inFlight {
	return &inFlight{slots: map[*inFlightSlot]bool{}, wake: make(chan struct{}, 1)}
}

// add is a slot for a new worker; remove it when the worker ends.
func (f *inFlight) add() *inFlightSlot {
	s := &inFlightSlot{}
	f.mu.Lock()
	f.slots[s] = true
	f.mu.Unlock()
	return s
}

func (f *inFlight) remove(s *inFlightSlot) {
	f.mu.Lock()
	delete(f.slots, s)
	f.mu.Unlock()
}

func (f *inFlight) start(s *inFlightSlot, m jetstream.Msg) {
	s.mu.Lock()
	s.m, s.since = m, time.Now()
	s.mu.Unlock()
	if f.busy.Add(1) == 1 {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

func (f *inFlight) end(s *inFlightSlot) {
	s.mu.Lock()
	s.m = nil
	s.mu.Unlock()
	f.busy.Add(-1)
}

// keepAlive reports progress on every message handled for longer than
// interval since its start or its last report, until ctx ends. Its ticker
// is stopped while no message is handled.
func (f *inFlight) keepAlive(ctx context.Context, interval time.Duration) {
	period := max(interval/4, time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if f.busy.Load() == 0 {
			t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-f.wake:
			}
			t.Reset(period)
		}
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f.mu.Lock()
			for s := range f.slots {
				s.mu.Lock()
				if s.m != nil && now.Sub(s.since) >= interval {
					_ = s.m.InProgress()
					s.since = now
				}
				s.mu.Unlock()
			}
			f.mu.Unlock()
		}
	}
}

// Later is what a handler returns when its message's outcome is known only
// after it returns, typically once an asynchronous publish is acknowledged:
// Consume calls wait from one goroutine, in the order the handlers
// returned, and settles the message by wait's result as if the handler had
// returned it. The handler's goroutine is free meanwhile, and no goroutine
// sits blocked per message (for dispatch that was a tenth of the
// benchmark's CPU). wait must end when ctx does.
func Later(wait func(ctx context.Context) error) error { return &later{wait: wait} }

type later struct{ wait func(context.Context) error }

// Wait returns the outcome out stands for: a Later's, once its wait
// returns (a panic in it is a retry), or out itself.
func Wait(ctx context.Context, out error) error {
	var l *later
	if errors.As(out, &l) {
		return safeWait(ctx, l.wait)
	}
	return out
}

// Then returns out, a handler's outcome, with f called on the outcome the
// loop settles the message by, just before it does: at once for a plain
// outcome, after the wait of a Later one (with nil when the wait panics).
func Then(out error, f func(settled error)) error {
	var l *later
	if !errors.As(out, &l) {
		f(out)
		return out
	}
	wait := l.wait
	return Later(func(ctx context.Context) (err error) {
		defer func() { f(err) }()
		return wait(ctx)
	})
}

func (l *later) Error() string { return "settled after the handler returned" }

type deferred struct {
	m    jetstream.Msg
	wait func(context.Context) error
}

// safeWait turns a panic of a Later wait into a retry.
func safeWait(ctx context.Context, wait func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = RetryAfter(30*time.Second, errors.New("settle panic: "+slogValue(r)))
		}
	}()
	return wait(ctx)
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
	case IsLeave(err):
		settleLogger(m, cfg).Debug("message left to another delivery of it", "err", err)
	case IsPermanent(err):
		log := settleLogger(m, cfg)
		if cfg.DeadLetter != nil {
			if derr := cfg.DeadLetter(ctx, m, err); derr != nil {
				log.Error("dead-letter failed; retrying the message instead", "err", derr, "cause", err)
				_ = cfg.hold.nak(m, cfg.RetryDelay, false)
				return
			}
		} else {
			log.Error("message given up", "err", err)
		}
		if terr := m.Term(); terr != nil {
			log.Warn("term failed; the message will be redelivered and given up again", "err", terr)
		}
	default:
		delay, ok := RetryDelay(err)
		if !ok {
			delay = cfg.RetryDelay
			settleLogger(m, cfg).Warn("handler failed; will retry", "err", err, "delay", delay)
		}
		if nerr := cfg.hold.nak(m, delay, false); nerr != nil {
			settleLogger(m, cfg).Debug("nak failed; the message comes back after its ack wait", "err", nerr)
		}
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
