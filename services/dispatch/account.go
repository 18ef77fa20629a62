package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/shared"
)

// ackWait is the job consumers' ack wait; the consume loop keeps slow sends
// alive with progress acks.
const ackWait = 30 * time.Second

// ConsumerName is the durable consumer of account's jobs.
func ConsumerName(account string) string { return "dispatch-" + account }

func consumerConfig(a *shared.Account) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerName(a.Name),
		Description:   "dispatch: jobs of account " + a.Name,
		FilterSubject: shared.JobsFilter(a.Name),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		// The in-flight cap: JetStream never has more than this many of the
		// account's jobs out, across every dispatch process.
		MaxAckPending: a.Concurrency,
	}
}

// accountRunner owns one account's consumer, token bucket and sender.
type accountRunner struct {
	svc     *Service
	limiter *rate.Limiter

	mu      sync.RWMutex
	acct    *shared.Account
	sender  channels.Sender
	ctx     context.Context
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newAccountRunner(parent context.Context, s *Service, a *shared.Account, sender channels.Sender) *accountRunner {
	ctx, cancel := context.WithCancel(parent)
	return &accountRunner{
		svc:     s,
		acct:    a,
		sender:  sender,
		limiter: rate.NewLimiter(rate.Limit(a.RatePerSec), a.Burst),
		ctx:     ctx,
		cancel:  cancel,
		stopped: make(chan struct{}),
	}
}

// canUpdateInPlace reports whether a change only touches pacing or adapter
// settings, so the consumer keeps running.
func (r *accountRunner) canUpdateInPlace(a *shared.Account) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct.Concurrency == a.Concurrency && r.acct.Channel == a.Channel
}

func (r *accountRunner) update(a *shared.Account, sender channels.Sender) {
	r.mu.Lock()
	r.acct, r.sender = a, sender
	r.mu.Unlock()
	r.limiter.SetLimit(rate.Limit(a.RatePerSec))
	r.limiter.SetBurst(a.Burst)
}

func (r *accountRunner) current() (*shared.Account, channels.Sender) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct, r.sender
}

func (r *accountRunner) run() {
	defer close(r.stopped)
	ctx := r.ctx
	a, _ := r.current()
	log := r.svc.log.With(shared.KeyAccount, a.Name)
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = r.svc.js.CreateOrUpdateConsumer(ctx, shared.StreamJobs, consumerConfig(a))
		if err == nil {
			break
		}
		log.Warn("cannot create account consumer; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	err := shared.Consume(ctx, cons, r.handle, shared.ConsumeConfig{
		Concurrency: a.Concurrency,
		AckWait:     ackWait,
		RetryDelay:  r.svc.cfg.BackoffBase,
		DeadLetter:  r.svc.deadLetter,
		Logger:      log,
	})
	if err != nil {
		log.Error("account consumer stopped", "err", err)
	}
}

// stop ends the runner and waits for its in-flight sends.
func (r *accountRunner) stop() {
	r.cancel()
	<-r.stopped
}
