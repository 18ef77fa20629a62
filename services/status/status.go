package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/alert"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/shared"
)

func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerStatus,
		Description:   "status: folds events into progress",
		FilterSubject: contract.SubjectEventsPrefix + ">",
		// One acknowledgement per flush, of its last event, acknowledges
		// every event before it (AckAll): the fold takes events in stream
		// order with no gap in their delivery sequence (rewind in
		// status.go), and a new holder resets the consumer to its
		// acknowledgement floor first, so nothing below an acknowledged
		// event is left unfolded.
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       10 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 200_000,
	}
}

// Service is the status service.
type Service struct {
	js          jetstream.JetStream
	cfg         Config
	log         *slog.Logger
	progress    jetstream.KeyValue
	checkpoints jetstream.ObjectStore
	leases      jetstream.KeyValue // holds the fold lease (foldlease.go)

	controls *shared.ControlWatcher
	changed  chan string
	// scores count each account's outcomes for its health score
	// (score.go); signals give its quality rating.
	scores  *scoreBook
	signals *shared.SignalsWatcher
	// alerts calls the operator's webhook (alerts.go); nil without one.
	alerts *alert.Notifier
	// series feeds the dashboard's charts from the events folded here
	// (series.go); nil without a dashboard.
	series *seriesStore
	// indexer publishes the recipient index (lookup.go), under mu.
	indexer *indexWriter
	// dashboardURL is set once the dashboard listens.
	dashboardURL atomic.Pointer[string]

	// parts are the fold's partitions (partition.go); share spreads them
	// over the status processes (nil with one partition: whoever takes
	// it folds everything).
	parts []*partition
	share *lease.FairShare
	// presence tells a killed holder of a lease (foldlease.go).
	presence *lease.Presence

	// mu guards the partitions' fold states and index entries, indexer,
	// and the counts below.
	mu sync.Mutex
	// Folded counts events folded since start (for metrics and tests).
	Folded int64
	// Checkpoints counts fold states saved since start (for tests).
	Checkpoints int64
}

// CheckpointsSaved returns how many fold states were saved since start.
func (s *Service) CheckpointsSaved() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Checkpoints
}

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	log := cfg.Logger.With(shared.KeyService, "status")
	alerts, err := alert.New(alert.Config{URL: cfg.AlertURL, Interval: cfg.AlertInterval, Count: cfg.metrics.Alert, Logger: log})
	if err != nil {
		return nil, err
	}
	svc := &Service{js: js, cfg: cfg, log: log, parts: newPartitions(cfg.Partitions), alerts: alerts, scores: newScoreBook()}
	if cfg.DashboardAddr != "" {
		// Only the dashboard draws them: without it they would be memory
		// (up to 34 MB) and work nobody reads.
		svc.series = newSeriesStore(cfg.SeriesLimit)
	}
	return svc, nil
}

// Run folds events until ctx is cancelled, flushing once more before it
// returns. Cancelled while it starts, it returns nil: a stop is not a
// failure, whatever step it cut short.
func (s *Service) Run(ctx context.Context) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			s.log.Debug("status stopped while starting", "err", err)
			err = nil
		}
	}()
	qa := &qualityAlerts{s: s, seen: map[string]string{}}
	// Each step is tried again while the server restarts (shared.SetUp).
	err = shared.SetUpAll(ctx, s.log,
		shared.Step{What: "buckets", Run: func(ctx context.Context) (err error) {
			if s.progress, err = s.js.KeyValue(ctx, contract.BucketProgress); err != nil {
				return err
			}
			s.checkpoints, err = s.js.ObjectStore(ctx, contract.BucketStatus)
			return err
		}},
		shared.Step{What: "controls", Run: func(ctx context.Context) (err error) {
			// A pause, resume or approval changes the state without any event.
			s.controls, err = shared.WatchControl(ctx, s.js, s.log, func(taskID string) {
				select {
				case s.partFor(taskID).changed <- taskID:
				default: // the loop is behind; the once-a-second refresh catches up
				}
			})
			return err
		}},
		shared.Step{What: "signals", Run: func(ctx context.Context) (err error) {
			s.signals, err = shared.WatchSignals(ctx, s.js, s.log, qa.changed)
			return err
		}},
	)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	qa.seed(s.signals)
	go shared.Supervise(ctx, s.log, "finished-task retention", s.forget)
	if err := shared.SetUp(ctx, s.log, "account pauses", s.watchAccountPauses); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	stopDashboard, err := s.startDashboard(ctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer stopDashboard()
	cons := make([]jetstream.Consumer, len(s.parts))
	for i, p := range s.parts {
		if err := shared.SetUp(ctx, s.log, "consumer "+p.consumer, func(ctx context.Context) (err error) {
			cons[i], err = s.openConsumer(ctx, p)
			return err
		}); err != nil {
			return fmt.Errorf("status: consumer %s: %w", p.consumer, err)
		}
	}
	var newLease func(key string) *lease.Lease
	var stopAnswering func()
	if err := shared.SetUp(ctx, s.log, "fold lease", func(ctx context.Context) (err error) {
		newLease, stopAnswering, err = s.foldLease(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer stopAnswering()
	if s.share != nil {
		go shared.Supervise(ctx, s.log, "fair share", s.share.Run)
	}
	s.log.Info("status started", "partitions", len(s.parts))
	var wg sync.WaitGroup
	for i, p := range s.parts {
		wg.Go(func() { s.runPartition(ctx, p, cons[i], newLease(p.leaseKey)) })
	}
	wg.Wait()
	return nil
}

// runPartition folds p's events whenever this process holds its lease,
// until ctx ends.
func (s *Service) runPartition(ctx context.Context, p *partition, cons jetstream.Consumer, l *lease.Lease) {
	log := s.log
	if p.n > 1 {
		log = log.With("partition", fmt.Sprintf("%d of %d", p.k, p.n))
	}
	released := s.watchFoldLease(ctx, p, log)
	for s.acquireFold(ctx, p, l, released, log) {
		err := s.foldWhileHeld(ctx, p, cons, l)
		if s.share != nil && !errors.Is(err, lease.ErrGiveBack) {
			s.share.Released()
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("stopped folding; another status process may fold now", "err", err)
	}
}

// replayUnacknowledged resets p's consumer to its acknowledgement floor
// before a new holding of the fold lease pulls from it. The events the
// previous holder (a killed process, or this one before it lost the lease)
// was handed and did not acknowledge would otherwise come back only after
// the ack wait, behind newer events, and the fold is not indifferent to
// order: a dead letter's re-queue event (failed to retrying) folded after
// the recipient's new outcome turned it back to retrying for good (scenario
// seed 595946141, status killed during a retry-dead). After the reset
// everything unacknowledged comes again in stream order, before anything
// newer, its delivery sequence starting again at 1; what was acknowledged
// beyond the floor is folded again, idempotently. It reports whether the
// reset went through.
func (s *Service) replayUnacknowledged(ctx context.Context, p *partition) bool {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.js.ResetConsumer(rctx, contract.StreamEvents, p.consumer); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("could not reset the fold consumer to its acknowledgement floor; not folding until it is",
				"consumer", p.consumer, "err", err)
		}
		return false
	}
	return true
}

// inSequence reports whether m is the delivery right after last (zero:
// none since the consumer was reset) and comes after it in the stream,
// and returns m's sequences. A delivery lost in transit (a pull that
// timed out while its events were on the way, a reconnect, another client
// pulling from the consumer) leaves a gap in the delivery sequence; as the
// fold acknowledges every event up to the last it flushed, folding past a
// gap would acknowledge the lost one unfolded. An event redelivered after
// the ack wait (a flush that took that long) comes after newer ones, and
// the fold is not indifferent to order.
func inSequence(m jetstream.Msg, last jetstream.SequencePair) (jetstream.SequencePair, bool) {
	meta, err := m.Metadata()
	if err != nil {
		return last, false
	}
	seq := meta.Sequence
	return seq, seq.Consumer == last.Consumer+1 && seq.Stream > last.Stream
}

// foldWhileHeld folds events while this process holds the fold lease: it
// returns nil after a stop (having flushed, acknowledged and released the
// lease), or why it lost the lease. Then the events it folded but did not
// flush are handed back unacknowledged and its fold states dropped: the
// next holder folds them again onto the checkpoints.
func (s *Service) foldWhileHeld(ctx context.Context, p *partition, cons jetstream.Consumer, l *lease.Lease) error {
	sctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	p.holds.Store(l)
	defer p.holds.Store(nil)
	go s.keepFoldLease(sctx, l, end)
	if p.k == 0 {
		go s.writeScores(sctx)
		go s.sweepOtherLayouts(sctx, s.log)
	}
	var shareCheckC <-chan time.Time
	if s.share != nil {
		t := time.NewTicker(shareCheck)
		defer t.Stop()
		shareCheckC = t.C
	}

	msgs := make(chan jetstream.Msg, 4096)
	// delivered is the sequences of the last event taken in, zero right
	// after the consumer was reset.
	var delivered jetstream.SequencePair
	stopReceiving, received := context.CancelFunc(func() {}), make(chan struct{})
	close(received)
	// start resets the consumer to its acknowledgement floor (retrying a
	// second apart until the reset goes through) and starts the pulls.
	start := func() {
		for !s.replayUnacknowledged(sctx, p) {
			select {
			case <-sctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		delivered = jetstream.SequencePair{}
		var rctx context.Context
		rctx, stopReceiving = context.WithCancel(sctx)
		done := make(chan struct{})
		received = done
		go func() {
			defer close(done)
			s.receive(rctx, p, cons, msgs)
		}()
	}
	// Stops the pulls and waits for them, so nothing more is handed over.
	stop := func() { stopReceiving(); <-received }
	defer func() { stop() }()
	start()

	ticker := time.NewTicker(s.cfg.FlushInterval)
	defer ticker.Stop()
	// Progress is checked against the checkpoints (reconcile.go) at the
	// first tick of the holding and at the first after each reconnect,
	// until a check gets through.
	checked, reconnects := false, s.js.Conn().Stats().Reconnects
	var folded []jetstream.Msg
	// soon fires finalFlushDelay after a fold turned a task final.
	var soon <-chan time.Time
	flush := func(ctx context.Context) {
		soon = nil
		s.mu.Lock()
		s.publishIndex(p)
		s.mu.Unlock()
		if err := s.flush(ctx, p); err != nil {
			if errors.Is(err, errNotConfirmed) {
				return // kept until the lease is confirmed again (keepFoldLease)
			}
			s.log.Warn("flush failed; events stay unacknowledged and will be folded again", "err", err)
			return
		}
		if len(folded) > 0 {
			// Acknowledges every event up to the last (AckAll).
			if err := folded[len(folded)-1].Ack(); err != nil {
				s.log.Warn("ack failed; the events will be redelivered and folded idempotently", "err", err)
			}
		}
		folded = folded[:0]
	}
	// rewind flushes and acknowledges what was folded, drops what waits,
	// and pulls again from the acknowledgement floor after pause: for an
	// event taken in out of sequence, or one that could not be folded now.
	// What was folded and could not be flushed is not acknowledged after
	// the reset (its delivery numbers are the old ones): it comes again and
	// is folded again, idempotently.
	rewind := func(pause time.Duration) {
		stop()
		flush(ctx)
		folded = folded[:0]
		drain(msgs)
		select {
		case <-sctx.Done():
			return
		case <-time.After(pause):
		}
		start()
	}
	// leave flushes, acknowledges and releases the lease, for a stop or a
	// hand-back; what it could not flush is handed back unacknowledged.
	leave := func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		flush(fctx)
		cancel()
		stop()
		s.handBack(p, append(folded, drain(msgs)...))
		if err := l.Release(context.Background()); err != nil {
			s.log.Warn("could not release the fold lease; a standby takes over when it expires", "err", err)
		}
	}
	for {
		select {
		case <-sctx.Done():
			if ctx.Err() != nil {
				leave()
				return nil
			}
			stop()
			s.handBack(p, append(folded, drain(msgs)...))
			return context.Cause(sctx)
		case <-shareCheckC:
			if s.share.ShouldGiveBack() {
				leave() // ShouldGiveBack counted the partition as released
				return lease.ErrGiveBack
			}
		case m := <-msgs:
			seq, ok := inSequence(m, delivered)
			if !ok {
				s.log.Warn("an event came out of sequence (a delivery lost on its way, or a redelivery); folding again from the acknowledgement floor",
					"consumer", p.consumer, "after_delivery", delivered.Consumer, "after_stream_seq", delivered.Stream,
					"delivery", seq.Consumer, "stream_seq", seq.Stream)
				rewind(0)
				continue
			}
			turnedFinal, err := s.fold(ctx, p, m)
			if err != nil {
				// Only a checkpoint read can fail here; without its state the
				// event cannot be folded exactly, and the ones after it must
				// wait for it, so stop and retry from it later.
				s.log.Warn("cannot fold event; will retry", "err", err)
				rewind(time.Second)
				continue
			}
			delivered = seq
			folded = append(folded, m)
			if len(folded) >= s.cfg.MaxUnflushed {
				flush(ctx)
			} else if soon == nil && turnedFinal {
				soon = time.After(finalFlushDelay)
			}
		case <-soon:
			flush(ctx)
		case <-ticker.C:
			if r := s.js.Conn().Stats().Reconnects; r != reconnects {
				checked, reconnects = false, r
			}
			if !checked {
				if err := s.reconcile(sctx, p); err != nil {
					s.log.Debug("progress not checked against the checkpoints yet", "err", err)
				} else {
					checked = true
				}
			}
			flush(ctx)
		case taskID := <-p.changed:
			if err := s.touch(ctx, p, taskID); err != nil {
				s.log.Warn("cannot load task state", shared.KeyTaskID, taskID, "err", err)
			}
		}
	}
}

// finalFlushDelay is how soon after a fold turned a task final its
// progress is written, rather than at the next FlushInterval tick (up to
// half a second by default): whoever waits for the task's end sees it
// then. The delay lets the events that came with the last outcome fold
// first, and bounds these extra writes to one per delay however many
// tasks end.
const finalFlushDelay = 20 * time.Millisecond

// receivePace is how long events gather on the server between two pulls
// while they keep coming, and receiveBatch the most one pull takes.
// Events arrive one at a time at a few thousand a second; taking what
// gathered in one pull every receivePace costs the server one write and
// this process one read and one wakeup per pull instead of per event.
// Progress is written every FlushInterval anyway, so it is at most
// receivePace later. After a failed attempt the wait ends at once
// (Service.hurry): the circuit breaker must not see a failing task
// receivePace late, while it keeps sending.
const (
	receivePace  = 50 * time.Millisecond
	receiveBatch = 2000
	// receiveWait is how long one pull waits for the first event at rest.
	receiveWait = 30 * time.Second
)

// receive hands the consumer's events to msgs until ctx ends. At rest it
// waits in one long pull for the next event (receiveWait at a time);
// then, while events keep coming, it takes what gathered every
// receivePace (at once while a pull comes back full or a failed attempt
// was folded), until a pull comes back empty. An event it could not
// hand over when ctx ended is handed back unacknowledged.
func (s *Service) receive(ctx context.Context, p *partition, cons jetstream.Consumer, msgs chan<- jetstream.Msg) {
	// pull hands over one batch's events and says how many there were.
	pull := func(b jetstream.MessageBatch, err error) int {
		if err != nil {
			s.log.Debug("pull", "err", err)
			s.remakeIfRemoved(ctx, p, cons)
			return -1
		}
		n := 0
		for m := range b.Messages() {
			n++
			select {
			case msgs <- m:
			case <-ctx.Done():
				_ = m.Nak()
			}
		}
		if err := b.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			s.log.Debug("pull", "err", err)
			if s.remakeIfRemoved(ctx, p, cons) && n == 0 {
				return -1
			}
		}
		return n
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-p.hurry:
			return true
		}
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, receiveWait)
		// One event ends the wait (a larger batch would keep it streaming
		// events one at a time until full).
		b, err := cons.Fetch(1, jetstream.FetchContext(wctx))
		n := pull(b, err)
		cancel()
		if n < 0 {
			wait(time.Second)
			continue
		}
		for n != 0 && ctx.Err() == nil {
			if n < receiveBatch && !wait(receivePace) {
				return
			}
			if n = pull(cons.FetchNoWait(receiveBatch)); n < 0 {
				wait(time.Second)
			}
		}
	}
}

// handBack drops every fold state of p and returns the events folded into
// them unacknowledged, for the next holder.
func (s *Service) handBack(p *partition, msgs []jetstream.Msg) {
	s.mu.Lock()
	p.folds = map[string]*taskFold{}
	// The next holder folds these events again and indexes them then.
	clear(p.pendingIndex)
	p.pendingIndex = p.pendingIndex[:0]
	s.mu.Unlock()
	for _, m := range msgs {
		_ = m.Nak()
	}
}

// drain returns what is buffered in msgs.
func drain(msgs chan jetstream.Msg) []jetstream.Msg {
	var out []jetstream.Msg
	for {
		select {
		case m := <-msgs:
			out = append(out, m)
		default:
			return out
		}
	}
}

// fold applies one event to its task's state, when the task is p's;
// partition 0 counts every event into the accounts' scores. It reports
// whether the event turned the task final, so the fold loop writes that
// progress soon (finalFlushDelay) instead of at the next tick.
func (s *Service) fold(ctx context.Context, p *partition, m jetstream.Msg) (turnedFinal bool, err error) {
	var ev contract.Event
	if err := contract.DecodeEvent(m.Data(), &ev); err != nil || !contract.ValidID(ev.TaskID) {
		if p.k == 0 {
			s.log.Warn("event does not decode; skipped", shared.KeySubject, m.Subject(), "err", err)
		}
		return false, nil
	}
	if !p.owns(ev.TaskID) {
		if p.k == 0 {
			// Another partition dedups it; a redelivery after a crash
			// may count twice in a score, which is an estimate.
			s.scores.note(&ev, true, time.Now())
		}
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.foldFor(ctx, p, ev.TaskID)
	if err != nil {
		return false, err
	}
	wasFinal, failedBefore, failsBefore := f.P.State.Final(), f.P.Failed, f.breaker.fails
	applied := f.apply(&ev)
	turnedFinal = !wasFinal && f.P.State.Final()
	if f.breaker.fails > failsBefore && !f.breaker.tripped {
		// A failed attempt: the breaker should see the next ones at once.
		select {
		case p.hurry <- struct{}{}:
		default:
		}
	}
	if p.k == 0 {
		s.scores.note(&ev, applied, time.Now())
	}
	if applied {
		f.dirty, f.unsaved = true, true
		if ev.Kind.ReceiptKind() {
			f.lastReceipt = time.Now()
		}
	}
	s.chart(f, &ev, applied)
	s.index(p, &ev, applied)
	s.noteFold(f, wasFinal, failedBefore)
	if reason, trip := f.breaker.check(s.cfg.CircuitThreshold); trip {
		s.alertTripped(ev.TaskID, reason)
		go s.pauseTask(ev.TaskID, reason)
	}
	s.Folded++
	s.cfg.metrics.Folded(ev.Kind)
	return turnedFinal, nil
}

// foldFor returns a task's fold state in p, loading its checkpoint or
// starting fresh. Call with s.mu held.
func (s *Service) foldFor(ctx context.Context, p *partition, taskID string) (*taskFold, error) {
	if f := p.folds[taskID]; f != nil {
		return f, nil
	}
	f, err := s.loadCheckpoint(ctx, taskID)
	if err != nil {
		return nil, err
	}
	if f == nil {
		f = newFold(taskID)
	}
	f.breaker.reset(s.cfg.CircuitWindow)
	p.folds[taskID] = f
	return f, nil
}

// touch marks a task of p for rewrite after its run state changed.
func (s *Service) touch(ctx context.Context, p *partition, taskID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.foldFor(ctx, p, taskID)
	if err != nil {
		return err
	}
	if ctl := s.controls.Get(taskID); ctl.Sends() {
		// Resumed: judge the task afresh.
		f.breaker.reset(s.cfg.CircuitWindow)
	}
	if f.Accepted && !f.P.State.Final() {
		f.dirty = true
	}
	return nil
}

// pauseTask asks ingest to pause a task the circuit breaker tripped on.
func (s *Service) pauseTask(taskID, reason string) {
	defer shared.Recover(s.log, "pausing task "+taskID, nil)
	s.log.Error("circuit breaker tripped; pausing task", shared.KeyTaskID, taskID, "reason", reason)
	req, _ := json.Marshal(contract.ControlRequest{Action: contract.ActionPause, Reason: reason})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.RequestAnswered(ctx, s.js.Conn(), contract.ControlSubject(taskID), req); err != nil {
		s.log.Error("could not pause task after circuit breaker tripped", shared.KeyTaskID, taskID, "err", err)
	}
}

// testHookCheckpointSaved, set by tests only, runs in flush after a
// task's checkpoint was saved, standing for a slow write.
var testHookCheckpointSaved func(taskID string)

// testHookProgressWrite, set by tests only, runs in flush just before a
// task's progress is written, after the lease was last asked.
var testHookProgressWrite func(taskID string)

// keepReceiving is how long a finished task's fold stays in memory after
// its last receipt.
const keepReceiving = time.Minute

// flush writes every changed task of p: checkpoint first, then progress.
// A running task is written at least once a second so its rate and ETA
// stay live even while it only waits.
func (s *Service) flush(ctx context.Context, p *partition) error {
	now := time.Now().UTC()
	s.mu.Lock()
	var todo []*taskFold
	for id, f := range p.folds {
		if !f.dirty && f.P.State.Final() && now.Sub(f.lastReceipt) >= keepReceiving {
			delete(p.folds, id) // written; receipts stopped coming
			continue
		}
		if !f.dirty && !f.P.State.Final() && now.Sub(f.lastWrite) >= time.Second {
			f.dirty = true
		}
		if f.dirty {
			f.refresh(now, s.controls.Get(f.P.TaskID))
			todo = append(todo, f)
		}
	}
	// Snapshot under the lock; write outside it.
	type write struct {
		f    *taskFold
		prog []byte
		save bool
	}
	writes := make([]write, 0, len(todo))
	for _, f := range todo {
		prog, err := json.Marshal(f.P)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		writes = append(writes, write{f: f, prog: prog, save: f.unsaved})
	}
	s.mu.Unlock()

	for _, w := range writes {
		if !p.mayWrite() {
			return errNotConfirmed
		}
		if w.save {
			s.mu.Lock()
			err := s.saveCheckpoint(ctx, w.f)
			if err == nil {
				w.f.unsaved = false
			}
			s.mu.Unlock()
			if err != nil {
				return fmt.Errorf("checkpoint %s: %w", w.f.P.TaskID, err)
			}
			s.mu.Lock()
			s.Checkpoints++
			s.mu.Unlock()
			if testHookCheckpointSaved != nil {
				testHookCheckpointSaved(w.f.P.TaskID)
			}
			// Asked again: the checkpoint's write can wait out a lost
			// connection and succeed after the reconnect, when another
			// replica that heard this one gone may hold the partition and
			// have written newer progress (the lease's Valid counts a
			// reconnect as unconfirmed).
			if !p.mayWrite() {
				return errNotConfirmed
			}
		}
		if testHookProgressWrite != nil {
			testHookProgressWrite(w.f.P.TaskID)
		}
		if err := s.writeProgress(ctx, p, w.f, w.prog); err != nil {
			return fmt.Errorf("progress %s: %w", w.f.P.TaskID, err)
		}
	}
	s.mu.Lock()
	for _, w := range writes {
		w.f.dirty = false
		w.f.lastWrite = now
		// Finished tasks leave memory (once receipts stopped coming for
		// keepReceiving); a late event reloads the checkpoint.
		if w.f.P.State.Final() && now.Sub(w.f.lastReceipt) >= keepReceiving {
			delete(p.folds, w.f.P.TaskID)
		}
	}
	s.mu.Unlock()
	return nil
}
