package ingest

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
	"github.com/oklog/ulid/v2"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/shared"
)

// ackWait is the ack wait of ingest's consumers. The consume loop marks a
// long expansion or a start waiting for send_at in progress every half of
// it, so it bounds only how long a message held by a killed ingest waits
// before the next one gets it (at 60 s, a scheduled task whose start was
// waiting when ingest was killed started a minute late: seed 47462567).
const ackWait = 5 * time.Second

// consumerConfig is declared next to the handler it feeds.
func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerIngest,
		Description:   "ingest: validates, dedups and expands tasks",
		FilterSubject: contract.SubjectTasks,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 16,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// Stats counts what ingest did since start.
type Stats struct {
	Accepted, Rejected, DuplicateIDs atomic.Int64
	// BatchesPublished counts render batches handed to the stream.
	BatchesPublished atomic.Int64
}

// Service is the ingest service.
type Service struct {
	js       jetstream.JetStream
	cfg      Config
	log      *slog.Logger
	accounts *shared.AccountWatcher
	tasks    jetstream.KeyValue
	objects  jetstream.ObjectStore
	control  jetstream.KeyValue
	progress jetstream.KeyValue
	controls *shared.ControlWatcher
	// taskLocks keeps the state changes (pause, resume, cancel) of one task
	// in order while control requests are served concurrently.
	taskLocks shared.KeyedMutex
	// batchBytes bounds a render batch's size: half the server's
	// max_payload, at most maxBatchBytes.
	batchBytes int
	Stats      Stats
}

// maxBatchBytes caps render batches whatever the server allows.
const maxBatchBytes = 4 << 20

// controlConcurrency bounds the control requests served at once.
const controlConcurrency = 32

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Service{js: js, cfg: cfg, log: cfg.Logger.With(shared.KeyService, "ingest")}, nil
}

// Run consumes tasks until ctx is cancelled.
func (s *Service) Run(ctx context.Context) error {
	s.batchBytes = int(min(s.js.Conn().MaxPayload()/2, maxBatchBytes))
	var cons, starts jetstream.Consumer
	// Each step is tried again while the server restarts (shared.SetUp).
	err := shared.SetUpAll(ctx, s.log,
		shared.Step{What: "buckets", Run: func(ctx context.Context) (err error) {
			if s.tasks, err = s.js.KeyValue(ctx, contract.BucketTasks); err != nil {
				return err
			}
			if s.objects, err = s.js.ObjectStore(ctx, contract.BucketRecipients); err != nil {
				return err
			}
			if s.control, err = s.js.KeyValue(ctx, contract.BucketControl); err != nil {
				return err
			}
			s.progress, err = s.js.KeyValue(ctx, contract.BucketProgress)
			return err
		}},
		shared.Step{What: "accounts", Run: func(ctx context.Context) (err error) {
			s.accounts, err = shared.WatchAccounts(ctx, s.js, s.log, nil)
			return err
		}},
		shared.Step{What: "controls", Run: func(ctx context.Context) (err error) {
			s.controls, err = shared.WatchControl(ctx, s.js, s.log, nil)
			return err
		}},
		shared.Step{What: "consumer", Run: func(ctx context.Context) (err error) {
			cons, err = s.js.CreateOrUpdateConsumer(ctx, contract.StreamTasks, consumerConfig())
			return err
		}},
		shared.Step{What: "start consumer", Run: func(ctx context.Context) (err error) {
			starts, err = s.js.CreateOrUpdateConsumer(ctx, contract.StreamTasks, startConsumerConfig())
			return err
		}},
	)
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	// Control requests are served concurrently: a retry-dead that waits for
	// dispatch must not hold up a pause behind it.
	served := shared.NewConcurrentHandler(controlConcurrency)
	sub, err := s.js.Conn().QueueSubscribe(contract.SubjectControlPrefix+"*", "ingest", served.Wrap(s.serveControl))
	if err != nil {
		return fmt.Errorf("ingest: control subscription: %w", err)
	}
	defer served.Drain(sub)
	s.log.Info("ingest started", "batch_size", s.cfg.BatchSize)
	// A consumer deleted under it (shared.ErrConsumerGone) stops the
	// service with an error; a restart creates it again.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() { s.keepAlive(ctx) })
	wg.Go(func() {
		if err := shared.Consume(ctx, starts, s.handleStart, shared.ConsumeConfig{AckWait: ackWait, RetryDelay: 2 * time.Second, Logger: s.log}); err != nil {
			stop(fmt.Errorf("ingest: start consumer: %w", err))
		}
	})
	err = shared.Consume(ctx, cons, s.handle, shared.ConsumeConfig{
		Concurrency: s.cfg.Concurrency,
		AckWait:     ackWait,
		RetryDelay:  2 * time.Second,
		Logger:      s.log,
	})
	if err != nil {
		stop(fmt.Errorf("ingest: %w", err))
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// handle runs one submission through validate, dedup, record, expand.
func (s *Service) handle(ctx context.Context, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return shared.Permanent(err)
	}
	seq := meta.Sequence.Stream
	headerID := msg.Headers().Get(jetstream.MsgIDHeader)

	task, err := contract.DecodeTask(msg.Data())
	if err != nil {
		return s.reject(ctx, salvageID(msg.Data(), headerID), err, seq)
	}
	if task.ID == "" {
		task.ID = headerID
	}
	if task.ID == "" {
		task.ID = ulid.Make().String()
	}
	task.Normalize()
	if err := task.Validate(time.Now()); err != nil {
		return s.reject(ctx, task.ID, err, seq)
	}
	ch, err := s.checkConfigured(ctx, task)
	if err != nil {
		return s.reject(ctx, task.ID, err, seq)
	}
	log := s.log.With(shared.KeyTaskID, task.ID, shared.KeySeq, seq)

	// Expansion is deterministic, so a redelivery computes the same batches
	// and the same indices, and the Nats-Msg-Ids drop what was published.
	var exp expansion
	var idx *listIndex
	if task.RecipientsObject != "" {
		if idx, err = s.indexList(ctx, ch, task.RecipientsObject, ""); err != nil {
			var fe *contract.FieldError
			if errors.As(err, &fe) {
				return s.reject(ctx, task.ID, err, seq)
			}
			return err
		}
		exp.duplicates = idx.duplicates
	} else {
		exp = expand(ch, task.Recipients)
	}
	total := len(exp.recipients)
	if idx != nil {
		total = idx.total
	}
	recipients := task.Recipients
	record := contract.TaskRecord{Task: *task, Seq: seq, Total: total, Duplicates: exp.duplicates, BatchSize: s.batchSizeFor(task), AcceptedAt: time.Now().UTC()}
	if idx != nil {
		record.ListDigest = idx.digest
	}
	record.Task.Recipients = nil
	fresh, stored, err := s.claim(ctx, &record)
	if err != nil {
		return err
	}
	if !fresh {
		s.Stats.DuplicateIDs.Add(1)
		s.cfg.metrics.Task(metrics.TaskDuplicateID)
		log.Warn("task id seen before; submission ignored")
		return nil
	}
	if stored != nil {
		// A redelivery of the claiming submission: resume from its record.
		record = *stored
	}
	task.Recipients = recipients

	// What happens now depends on the task: a future send_at schedules its
	// start, test recipients go first and wait for approval, anything else
	// starts at once.
	state := contract.StateProcessing
	sendAt := task.SendTime()
	switch {
	case sendAt.After(time.Now().Add(time.Second)):
		state = contract.StateScheduled
	case len(task.TestRecipients) > 0:
		state = contract.StateAwaitingApproval
	}
	if state != contract.StateProcessing {
		if err := shared.PutControl(ctx, s.control, task.ID, contract.Control{State: state}); err != nil {
			return err
		}
	}
	if err := shared.PublishEvent(ctx, s.js, &contract.Event{
		TaskID: task.ID, Kind: contract.EventAccepted, Index: -1, State: state,
		Total: record.Total, Duplicates: record.Duplicates, At: record.AcceptedAt,
	}); err != nil {
		return fmt.Errorf("publish accepted: %w", err)
	}
	switch state {
	case contract.StateScheduled:
		if err := s.scheduleStart(ctx, task.ID, sendAt); err != nil {
			return err
		}
		log.Info("task scheduled", "send_at", sendAt)
	case contract.StateAwaitingApproval:
		if err := s.publishTestBatches(ctx, task, ch, stored != nil); err != nil {
			return err
		}
	default:
		if idx != nil {
			if err = s.publishList(ctx, ch, &record, idx, stored != nil); isListChanged(err) {
				return s.cancelForList(ctx, &record, err)
			}
		} else {
			err = s.publishBatches(ctx, batches(task.ID, exp.recipients, s.batchSize(&record), s.batchBytes, false), stored != nil)
		}
		if err != nil {
			return err
		}
		record.Expanded = true
		if err := s.putRecord(ctx, &record); err != nil {
			log.Warn("could not mark task expanded", "err", err)
		}
	}
	s.Stats.Accepted.Add(1)
	s.cfg.metrics.Task(metrics.TaskAccepted)
	log.Info("task accepted", "total", record.Total, "duplicates", record.Duplicates, "channel", task.Channel)
	return nil
}

// claim creates the task's record. It reports fresh=false when the id
// belongs to another submission. A redelivery of the claiming submission
// (same stream sequence) is fresh and returns the stored record, so a crash
// mid-expansion resumes from its checkpoint.
func (s *Service) claim(ctx context.Context, r *contract.TaskRecord) (fresh bool, stored *contract.TaskRecord, err error) {
	data, err := json.Marshal(r)
	if err != nil {
		return false, nil, shared.Permanent(err)
	}
	_, err = s.tasks.Create(ctx, r.Task.ID, data)
	if err == nil {
		return true, nil, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil, fmt.Errorf("record task: %w", err)
	}
	entry, err := s.tasks.Get(ctx, r.Task.ID)
	if err != nil {
		return false, nil, fmt.Errorf("read task record: %w", err)
	}
	var prev contract.TaskRecord
	if json.Unmarshal(entry.Value(), &prev) != nil || prev.Seq != r.Seq {
		return false, nil, nil
	}
	return true, &prev, nil
}

func (s *Service) putRecord(ctx context.Context, r *contract.TaskRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = s.tasks.Put(ctx, r.Task.ID, data)
	return err
}

// publishBatches publishes render batches asynchronously and waits for every
// ack; any failure returns an error so the whole task is retried (dedup ids
// make the retry cheap and exact). resumed says they may have been
// published before (a crash, a redelivery), so render marks their jobs for
// the ledger check.
func (s *Service) publishBatches(ctx context.Context, bs []contract.RenderBatch, resumed bool) error {
	futures := make([]jetstream.PubAckFuture, 0, len(bs))
	for _, b := range bs {
		b.Resumed = b.Resumed || resumed
		data, err := contract.EncodeRenderBatch(&b)
		if err != nil {
			return shared.Permanent(err)
		}
		id := fmt.Sprintf("%s.rb.%d", b.TaskID, b.First)
		if b.Test {
			id = fmt.Sprintf("%s.rbt.%d", b.TaskID, b.First)
		}
		f, err := s.js.PublishAsync(contract.RenderSubject(b.TaskID), data, jetstream.WithMsgID(id))
		if err != nil {
			return fmt.Errorf("publish render batch: %w", err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publish render batch: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.Stats.BatchesPublished.Add(int64(len(bs)))
	return nil
}

// reject records an invalid submission as rejected: nothing is dropped
// silently. Status turns the event into progress with the error.
func (s *Service) reject(ctx context.Context, id string, cause error, seq uint64) error {
	if !contract.ValidID(id) {
		id = ulid.Make().String()
	}
	// An id that belongs to an accepted task keeps its progress: the bad
	// resubmission is a duplicate, not a reason to mark the task rejected.
	if _, err := s.tasks.Get(ctx, id); err == nil {
		s.Stats.DuplicateIDs.Add(1)
		s.cfg.metrics.Task(metrics.TaskDuplicateID)
		s.log.Warn("invalid resubmission of an accepted task id ignored", shared.KeyTaskID, id, shared.KeySeq, seq, "err", cause)
		return nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("read task record: %w", err)
	}
	s.Stats.Rejected.Add(1)
	s.cfg.metrics.Task(metrics.TaskRejected)
	s.log.Warn("task rejected", shared.KeyTaskID, id, shared.KeySeq, seq, "err", cause)
	err := shared.PublishEvent(ctx, s.js, &contract.Event{
		TaskID: id, Kind: contract.EventRejected, Index: -1, Error: cause.Error(),
		State: contract.StateRejected, Code: fmt.Sprintf("tasks_seq=%d", seq),
	})
	if err != nil {
		return fmt.Errorf("publish rejected: %w", err)
	}
	return nil
}

// salvageID finds an id for a task that did not decode: its "id" field if
// that much parses, else the Nats-Msg-Id header.
func salvageID(data []byte, headerID string) string {
	var probe struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(data, &probe) == nil {
		if id, ok := probe.ID.(string); ok && contract.ValidID(id) {
			return id
		}
	}
	return headerID
}
