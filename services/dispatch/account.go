package dispatch

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/shared"
)

// ackWait is the job consumers' ack wait; the consume loop keeps slow sends
// alive with progress acks.
const ackWait = 10 * time.Second

// priorityGroup is the pinned priority group of every account consumer.
const priorityGroup = "dispatch"

// pinIDHeader carries the pin a message was delivered under.
const pinIDHeader = "Nats-Pin-Id"

// ConsumerName is the durable consumer of account's jobs.
func ConsumerName(account string) string { return "dispatch-" + account }

// pinnedTTL is how long the server keeps a pin after the pinned client's
// last pull request. nats-server 2.15 does not unpin when the client's
// connection closes, so this bounds a takeover after a crash (a graceful
// stop releases the pin at once, see releasePin).
const pinnedTTL = 5 * time.Second

// pullExpiry is the expiry of each pull request, well inside pinnedTTL. The
// pin is refreshed only by pull requests, and an owner whose slots are all
// held (its sends waiting out a Retry-After, say) makes a new one only when
// the last expires: with the client's default of 30 s a wait longer than
// pinnedTTL handed the account to another replica, which started at the full
// configured rate while the old owner still sent its held jobs.
const pullExpiry = pinnedTTL / 4

// consumerConfig pins each account's consumer to one client at a time
// (PriorityPolicyPinned): whichever dispatch process holds the pin is the
// account's only sender, so its local token bucket is the account's rate
// across all replicas. A stopping owner releases the pin; a dead one loses
// it pinnedTTL after its last pull, and its unacknowledged jobs come back
// after ackWait.
//
// MaxAckPending is jobsInFlight: concurrency, or for a batch account
// enough jobs to fill its calls (batcher.go).
func consumerConfig(a *shared.Account) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        ConsumerName(a.Name),
		Description:    "dispatch: jobs of account " + a.Name,
		FilterSubject:  shared.JobsFilter(a.Name),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  jobsInFlight(a), // the in-flight cap, across every process
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{priorityGroup},
		PinnedTTL:      pinnedTTL,
	}
}

// accountRunner owns one account's consumer, pacer, caps and sender.
type accountRunner struct {
	svc   *Service
	name  string
	pacer *pacer
	log   *slog.Logger
	// batch merges sends of identical text into one call; nil unless the
	// account's max_batch is above 1, so single sends take no extra hop.
	batch *batcher

	mu          sync.RWMutex
	acct        *shared.Account
	sender      channels.Sender
	caps        *capTracker
	paused      bool
	pauseReason string
	pausedSince time.Time
	authFails   int
	lastActive  time.Time
	// pinID is the priority-group pin this runner's last job was delivered
	// under; releasePin compares it with the consumer's current pin.
	pinID string

	ctx     context.Context
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newAccountRunner(parent context.Context, s *Service, a *shared.Account, sender channels.Sender) *accountRunner {
	ctx, cancel := context.WithCancel(parent)
	r := &accountRunner{
		svc:     s,
		name:    a.Name,
		acct:    a,
		sender:  sender,
		pacer:   newPacer(a.RatePerSec, a.MinRatePerSec, a.Burst, a.RecoverAfter),
		log:     s.log.With(shared.KeyAccount, a.Name),
		ctx:     ctx,
		cancel:  cancel,
		stopped: make(chan struct{}),
	}
	if a.MaxBatch > 1 {
		r.batch = r.newAccountBatcher(a.MaxBatch)
	}
	return r
}

// canUpdateInPlace reports whether a change leaves the consumer (and the
// batcher, which max_batch sizes) as it is.
func (r *accountRunner) canUpdateInPlace(a *shared.Account) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct.Concurrency == a.Concurrency && r.acct.MaxBatch == a.MaxBatch
}

// update applies an account edit. An edit is also how an operator clears a
// pause: whoever fixed the token says so by saving the account.
func (r *accountRunner) update(a *shared.Account, sender channels.Sender) {
	r.mu.Lock()
	old := r.sender
	r.acct, r.sender = a, sender
	wasPaused := r.paused
	r.paused, r.pauseReason, r.authFails = false, "", 0
	r.mu.Unlock()
	closeSender(old)
	r.pacer.configure(a.RatePerSec, a.MinRatePerSec, a.Burst, a.RecoverAfter)
	if wasPaused {
		r.log.Info("account edited; pause cleared")
	}
	r.writeHealth(r.ctx)
}

func closeSender(s channels.Sender) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

func (r *accountRunner) current() (*shared.Account, channels.Sender) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.acct, r.sender
}

// draining reports whether the account must not send (disabled or paused)
// and why; its jobs then move to healthy accounts.
func (r *accountRunner) draining() (bool, string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.acct.IsEnabled() {
		return true, "account " + r.name + " is disabled"
	}
	if r.paused {
		return true, "account " + r.name + " is paused: " + r.pauseReason
	}
	return false, ""
}

// pause stops the account sending until its value is edited.
func (r *accountRunner) pause(reason string) {
	r.mu.Lock()
	if r.paused {
		r.mu.Unlock()
		return
	}
	r.paused, r.pauseReason, r.pausedSince = true, reason, time.Now().UTC()
	r.mu.Unlock()
	r.log.Error("ACCOUNT PAUSED: it sends nothing until its value in broadcast_accounts is edited; its jobs move to healthy accounts",
		"reason", reason)
	r.writeHealth(r.ctx)
}

// writeHealth publishes the account's health and effective rate.
func (r *accountRunner) writeHealth(ctx context.Context) {
	cur, ceiling := r.pacer.effective()
	r.mu.RLock()
	h := shared.AccountHealth{State: shared.HealthHealthy, RatePerSec: cur, Ceiling: ceiling, DailyCap: r.dailyCap(), UpdatedAt: time.Now().UTC()}
	if r.paused {
		h.State, h.Reason, h.Since = shared.HealthPaused, r.pauseReason, r.pausedSince
	}
	caps := r.caps
	r.mu.RUnlock()
	if caps != nil {
		h.DailyUsed = caps.used(time.Now())
	}
	data, _ := json.Marshal(h)
	if _, err := r.svc.healthKV.Put(ctx, r.name, data); err != nil && ctx.Err() == nil {
		r.log.Warn("could not write account health", "err", err)
	}
}

// dailyCap is the account's cap (a WhatsApp tier counts as one). Call with
// r.mu held.
func (r *accountRunner) dailyCap() int { return channels.EffectiveDailyCap(r.acct) }

// capTracker returns the account's cap tracker, starting it on first use.
func (r *accountRunner) capTracker(ctx context.Context) (*capTracker, error) {
	r.mu.RLock()
	c := r.caps
	r.mu.RUnlock()
	if c != nil {
		return c, nil
	}
	c, err := newCapTracker(r.ctx, r.svc.sends, r.name, r.log)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.caps == nil {
		r.caps = c
	}
	c = r.caps
	r.mu.Unlock()
	return c, nil
}

func (r *accountRunner) run() {
	defer close(r.stopped)
	ctx := r.ctx
	select {
	case <-r.svc.ready:
	case <-ctx.Done():
		return
	}
	a, _ := r.current()
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = r.svc.js.CreateOrUpdateConsumer(ctx, shared.StreamJobs, consumerConfig(a))
		if err == nil {
			break
		}
		r.log.Warn("cannot create account consumer; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	go r.reportHealth(ctx)
	if r.batch != nil {
		// For a batch account concurrency is provider calls in flight.
		r.batch.start(ctx, a.Concurrency)
	}
	err := shared.Consume(ctx, cons, r.handle, shared.ConsumeConfig{
		Concurrency: jobsInFlight(a),
		AckWait:     ackWait,
		RetryDelay:  r.svc.cfg.BackoffBase,
		DeadLetter:  r.svc.deadLetter,
		PullOptions: []jetstream.PullConsumeOpt{jetstream.PullPriorityGroup(priorityGroup), jetstream.PullExpiry(pullExpiry)},
		Logger:      r.log,
	})
	if err != nil {
		r.log.Error("account consumer stopped", "err", err)
	}
	r.releasePin(cons)
}

// releasePin unpins the account's consumer when this runner holds the pin,
// so another replica takes the account over at once. The server does not
// unpin a client that stops pulling (nor one whose connection closes) until
// PinnedTTL has passed without a pull from it: without this a graceful stop
// or restart left the account sending nothing for about 10 s.
func (r *accountRunner) releasePin(cons jetstream.Consumer) {
	r.mu.RLock()
	pin := r.pinID
	r.mu.RUnlock()
	if pin == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 2*time.Second)
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil {
		return
	}
	for _, g := range info.PriorityGroups {
		if g.Group != priorityGroup || g.PinnedClientID != pin {
			continue
		}
		stream, err := r.svc.js.Stream(ctx, shared.StreamJobs)
		if err == nil {
			err = stream.UnpinConsumer(ctx, ConsumerName(r.name), priorityGroup)
		}
		if err != nil {
			r.log.Warn("could not release the account's pin; another replica takes over after PinnedTTL", "err", err)
			return
		}
		r.log.Info("released the account's pin to another replica")
	}
}

// reportHealth refreshes the health value while this process is the
// account's active sender, so dashboards and render see its effective rate
// and remaining daily capacity.
func (r *accountRunner) reportHealth(ctx context.Context) {
	t := time.NewTicker(r.svc.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.mu.RLock()
			active := time.Since(r.lastActive) < 3*r.svc.cfg.HealthInterval
			r.mu.RUnlock()
			if active {
				r.writeHealth(ctx)
			}
		}
	}
}

// stop ends the runner and waits for its in-flight sends.
func (r *accountRunner) stop() {
	r.cancel()
	<-r.stopped
	_, s := r.current()
	closeSender(s)
}
