package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// Service is the dispatch service: one runner per account.
type Service struct {
	js jetstream.JetStream
	// events publishes sent events asynchronously (publishSent), each
	// failing after sentEventTimeout without an ack; set by Run.
	events *shared.Publisher
	cfg    Config
	log    *slog.Logger
	ledger jetstream.KeyValue
	sent   *sentIndex
	// live is the JOBS messages being handled here, so a redelivery that
	// comes while its earlier delivery is still handled is left to it
	// (live.go).
	live *liveJobs
	// holds is the jobs whose checked deliveries are handled here, so
	// another message of the job waits for them (jobhold.go).
	holds    *jobHolds
	healthKV jetstream.KeyValue
	sends    jetstream.KeyValue
	tasks    jetstream.KeyValue // task records, read by the parked-job sweeper and poolOf
	pools    poolCache
	jobs     jetstream.Stream // JOBS, for the lanes' subjects (lanes.go)
	// laneJobs is the lane finder's latest look at each closed lane's
	// subjects (lanes.go).
	laneJobs [numLanes]atomic.Pointer[laneLook]
	leases   jetstream.KeyValue // which process sends for each account (lease.go)
	asleepKV jetstream.KeyValue // sleeping accounts' asleep marks (idle.go)
	// keptConsumers counts this replica's sleeping accounts that kept
	// their normal lane's consumer (idle.go, Config.KeptConsumers).
	keptConsumers atomic.Int64
	leaseTTL      time.Duration    // the leases bucket's TTL
	share         *lease.FairShare // how many accounts this replica takes
	presence      *lease.Presence  // whether a lease holder's connection is gone
	conn          *lease.ConnWatch // whether the connection stayed up since a lease was confirmed
	inFlight      chan struct{}    // Config.MaxInFlight slots; nil when unlimited
	// parts runs the jobs of job groups' messages (jobgroup.go); set by Run.
	parts    *shared.GoPool
	accounts *shared.AccountWatcher
	health   *shared.HealthWatcher
	controls *shared.ControlWatcher
	// suppressed is the suppression list's view, checked right before a
	// send (mayStillSend) so an entry added while a job waits stops it.
	suppressed *suppress.View
	// signals are the providers' quality ratings and messaging limits
	// (quality.go, limits.go).
	signals *shared.SignalsWatcher
	// portfolioCaps are the shared daily counts of portfolios
	// (portfolio.go), made on first use.
	portfolioMu   sync.Mutex
	portfolioCaps map[string]*capTracker
	// policy is the recipient policy's view and frequency its counts
	// (policy.go).
	policy    *policy.View
	frequency *policy.Counter

	mu      sync.Mutex
	runners map[string]*accountRunner
	// deletedAccounts are runners kept after their account was deleted,
	// until their jobs have moved (reap.go).
	deletedAccounts map[string]bool
	// numRunners is len(runners) for the fair share, read without mu: a
	// runner stopping (under mu, in Run and accountChanged) waits for its
	// give-back check and its acquire loop, which count the accounts; taking
	// mu there deadlocked a stopping replica until its connection closed.
	numRunners atomic.Int32
	ctx        context.Context
	ready      chan struct{}
	// wakeSignal and wakeChannels ask the waker (wake.go) to wake the held
	// jobs of the channels whose accounts gained capacity.
	wakeSignal   chan struct{}
	wakeMu       sync.Mutex
	wakeChannels map[string]bool
	wg           sync.WaitGroup

	// backlogs caches accounts' queued jobs for the digest backlog rule.
	backlogs backlogs
}

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Service{js: js, cfg: cfg, log: cfg.Logger.With(shared.KeyService, "dispatch"), sent: newSentIndex(js),
		live: newLiveJobs(), holds: newJobHolds(), runners: map[string]*accountRunner{}, deletedAccounts: map[string]bool{}, ready: make(chan struct{}),
		portfolioCaps: map[string]*capTracker{},
		wakeSignal:    make(chan struct{}, 1), wakeChannels: map[string]bool{}}, nil
}

// Run dispatches until ctx is cancelled, then lets in-flight sends finish.
func (s *Service) Run(ctx context.Context) error {
	var st jetstream.KeyValueStatus
	// Each step is tried again while the server restarts (shared.SetUp).
	err := shared.SetUpAll(ctx, s.log,
		shared.Step{What: "buckets", Run: func(ctx context.Context) (err error) {
			for name, dst := range map[string]*jetstream.KeyValue{contract.BucketLedger: &s.ledger, contract.BucketHealth: &s.healthKV, contract.BucketSends: &s.sends, contract.BucketTasks: &s.tasks, contract.BucketLeases: &s.leases, contract.BucketLanes: &s.asleepKV} {
				if *dst, err = s.js.KeyValue(ctx, name); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
			if s.jobs, err = s.js.Stream(ctx, contract.StreamJobs); err != nil {
				return fmt.Errorf("%s: %w", contract.StreamJobs, err)
			}
			if st, err = s.leases.Status(ctx); err != nil {
				return fmt.Errorf("%s: %w", contract.BucketLeases, err)
			}
			return nil
		}})
	if err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	if s.leaseTTL = st.TTL(); s.leaseTTL <= lease.Margin+lease.Refresh {
		return fmt.Errorf("dispatch: bucket %s has TTL %s; leases need one above %s (shared.LeaseTTL is %s)",
			contract.BucketLeases, s.leaseTTL, lease.Margin+lease.Refresh, shared.LeaseTTL)
	}
	s.share = s.newShare()
	s.presence = lease.NewPresence(s.js.Conn(), "dispatch")
	s.share.ReplicaGone = s.presence.Gone // a killed replica's accounts are taken at once
	s.conn = lease.WatchConn(s.js.Conn())
	stopAnswering, err := s.presence.Answer(s.share.Replica, s.log)
	if err != nil {
		return fmt.Errorf("dispatch: alive subject: %w", err)
	}
	defer stopAnswering()
	if s.cfg.MaxInFlight > 0 {
		s.inFlight = make(chan struct{}, s.cfg.MaxInFlight)
	}
	s.ctx = ctx
	s.parts = shared.NewGoPool(ctx, partIdle)
	// Every pending sent event belongs to an unacknowledged job, so the
	// consumers' MaxAckPending bound them; a smaller cap would stall a
	// replica with many accounts.
	if s.events, err = shared.NewPublisher(s.js.Conn(), 1<<16, sentEventTimeout); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	defer s.events.Close()
	err = shared.SetUpAll(ctx, s.log,
		shared.Step{What: "health", Run: func(ctx context.Context) (err error) {
			s.health, err = shared.WatchHealth(ctx, s.js, s.log)
			return err
		}},
		shared.Step{What: "controls", Run: func(ctx context.Context) (err error) {
			s.controls, err = shared.WatchControl(ctx, s.js, s.log, nil)
			return err
		}},
		shared.Step{What: "suppressions", Run: func(ctx context.Context) (err error) {
			s.suppressed, err = s.cfg.Suppressions.View(ctx, s.js, s.log)
			return err
		}},
		shared.Step{What: "policy", Run: func(ctx context.Context) (err error) {
			if s.policy, err = policy.Watch(ctx, s.js, s.log); err != nil {
				return err
			}
			s.frequency, err = policy.OpenCounter(ctx, s.js)
			return err
		}},
		shared.Step{What: "signals", Run: func(ctx context.Context) (err error) {
			s.signals, err = shared.WatchSignals(ctx, s.js, s.log, s.signalsChanged)
			return err
		}},
		shared.Step{What: "accounts", Run: func(ctx context.Context) (err error) {
			s.accounts, err = shared.WatchAccounts(ctx, s.js, s.log, s.accountChanged)
			return err
		}},
	)
	if err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	go shared.Supervise(ctx, s.log, "fair share", s.share.Run) // after the accounts are known: it counts them
	// Held jobs wait for capacity; an edit that adds some wakes them, and so
	// does a start, for edits made while no dispatch ran.
	go shared.Supervise(ctx, s.log, "held-job waker", s.runWaker)
	go shared.Supervise(ctx, s.log, "deleted-account reaper", s.runReaper)
	go shared.Supervise(ctx, s.log, "lane finder", s.findLanes)
	// Render's wake notices (idle.go) wake sleeping accounts ahead of the
	// finder.
	notices, err := s.js.Conn().Subscribe(contract.SubjectWake, s.onWakeNotice)
	if err != nil {
		return fmt.Errorf("dispatch: wake notices: %w", err)
	}
	defer func() { _ = notices.Unsubscribe() }()
	// Re-queueing parked jobs and dead letters (requeue.go): ingest asks.
	stopRequeue, err := s.startRequeue(ctx)
	if err != nil {
		return err
	}
	defer stopRequeue()
	close(s.ready)
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

// dispatchReplicaPrefix starts the keys dispatch replicas announce
// themselves under in KV broadcast_leases (account names cannot contain a
// dot, so these never clash with an account's lease).
const dispatchReplicaPrefix = "replica."

// newShare is this process's fair share of the accounts. It counts them
// without s.mu, so it may be asked while s.mu is held (see numRunners).
func (s *Service) newShare() *lease.FairShare {
	return lease.NewFairShare(s.leases, dispatchReplicaPrefix, func() int { return int(s.numRunners.Load()) })
}

// accountChanged applies an edit of broadcast_accounts: pacing and adapter
// changes apply in place, a concurrency change restarts the consumer. A
// disabled or deleted account keeps its runner, which moves its queued jobs
// to healthy accounts instead of sending them.
func (s *Service) accountChanged(c shared.AccountChange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.log.With(shared.KeyAccount, c.Name)
	old := s.runners[c.Name]
	acct := c.Account
	if acct == nil {
		if old == nil {
			return
		}
		// Deleted or unreadable: keep the runner with the last known
		// settings, marked disabled, so its queued jobs move to healthy
		// accounts.
		prev, _ := old.current()
		cp := *prev
		disabled := false
		cp.Enabled = &disabled
		acct = &cp
		log.Warn("account deleted or invalid; its queued jobs move to healthy accounts")
		s.deletedAccounts[c.Name] = true
	} else {
		delete(s.deletedAccounts, c.Name)
	}
	ch, err := s.cfg.Channels.Get(acct.Channel)
	if err != nil {
		log.Error("account has an unknown channel; not started", "err", err)
		return
	}
	if n := channels.EffectiveMaxBatch(ch, acct); n != acct.MaxBatch {
		if n == 1 {
			log.Warn("max_batch ignored: the channel sends one recipient per call", "channel", acct.Channel, "max_batch", acct.MaxBatch)
		} else {
			log.Warn("max_batch capped at the channel's limit", "channel", acct.Channel, "max_batch", acct.MaxBatch, "limit", n)
		}
		cp := *acct
		cp.MaxBatch = n
		acct = &cp
	}
	// The account names the variable dispatch reads and sends to the
	// account's endpoint: only secret variables, never dispatch's own.
	err = contract.CheckSecretEnv(acct.SecretEnv, s.cfg.SecretEnvs)
	var sender channels.Sender
	if err == nil {
		sender, err = ch.NewSender(acct, s.cfg.Getenv)
	}
	if err != nil {
		log.Error("account misconfigured; its jobs move to healthy accounts", "err", err)
		if old == nil {
			s.startMisconfigured(acct, err)
			return
		}
		prev, sender0 := old.current()
		cp := *prev
		disabled := false
		cp.Enabled = &disabled
		acct, sender = &cp, sender0
	}
	if acct.IsEnabled() && addsCapacity(old, acct) {
		s.wakeLater(acct.Channel)
	}
	if old != nil && old.canUpdateInPlace(acct) {
		old.update(acct, sender)
		log.Info("account updated", "enabled", acct.IsEnabled(), "rate_per_sec", acct.RatePerSec, "burst", acct.Burst)
		return
	}
	if old != nil {
		old.stop()
	}
	r := newAccountRunner(s.ctx, s, acct, sender)
	s.runners[c.Name] = r
	s.numRunners.Store(int32(len(s.runners)))
	s.wg.Go(r.run)
	log.Info("account started", "channel", acct.Channel, "enabled", acct.IsEnabled(), "rate_per_sec", acct.RatePerSec,
		"burst", acct.Burst, "concurrency", acct.Concurrency)
}

// startMisconfigured starts a runner for a new account that cannot send
// (its secret_env refused, its options bad), paused with the reason: its
// health says why, and its queued jobs move to healthy accounts of their
// pool or wait with that reason in their tasks' progress. Without it they
// would wait unseen. An edit that fixes the account clears the pause, as
// any edit does. Called with s.mu held.
func (s *Service) startMisconfigured(acct *contract.Account, cause error) {
	r := newAccountRunner(s.ctx, s, acct, nil)
	r.paused, r.pauseReason, r.pausedSince = true, "misconfigured: "+cause.Error(), time.Now().UTC()
	s.runners[acct.Name] = r
	s.numRunners.Store(int32(len(s.runners)))
	s.wg.Go(r.run)
	// Its health is written now: a runner that never sends is never the
	// active sender whose reports refresh it.
	s.wg.Go(func() { r.writeHealth(r.ctx) })
}
