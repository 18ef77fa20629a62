package render

import (
	"context"
	"errors"
	"fmt"
	htmlpkg "html"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// ackWait is the render consumer's ack wait. The consume loop marks a batch
// still being rendered in progress every half of it, so it bounds only how
// long the batches a killed render held wait before another render gets
// them.
const ackWait = 5 * time.Second

func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerRender,
		Description:   "render: fills templates and enqueues jobs",
		FilterSubject: contract.SubjectRenderPrefix + ">",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 64,
	}
}

// Service is the render service.
type Service struct {
	js    jetstream.JetStream
	pub   *shared.Publisher // jobs and skipped events, set by Run
	cfg   Config
	log   *slog.Logger
	tasks jetstream.KeyValue
	// groupings is KV broadcast_groupings (grouping.go), nil when jobs go
	// one per message.
	groupings jetstream.KeyValue
	accounts  *shared.AccountWatcher
	health    *shared.HealthWatcher
	// suppressed is the suppression list's view (hashes only).
	suppressed *suppress.View
	// inFlight holds Config.RecipientsInFlight: the recipients of the
	// batches being rendered.
	inFlight *semaphore.Weighted
	cache    specCache
	waits    waitLog
}

// New prepares the service; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Service{js: js, cfg: cfg, log: cfg.Logger.With(shared.KeyService, "render"), cache: specCache{specs: map[string]*spec{}},
		inFlight: semaphore.NewWeighted(int64(cfg.RecipientsInFlight))}, nil
}

// Run consumes render batches until ctx is cancelled.
func (s *Service) Run(ctx context.Context) error {
	var cons jetstream.Consumer
	err := shared.SetUpAll(ctx, s.log,
		shared.Step{What: "buckets", Run: func(ctx context.Context) (err error) {
			if s.tasks, err = s.js.KeyValue(ctx, contract.BucketTasks); err != nil || s.cfg.JobsPerMessage <= 1 {
				return err
			}
			s.groupings, err = s.js.KeyValue(ctx, contract.BucketGroupings)
			return err
		}},
		shared.Step{What: "accounts", Run: func(ctx context.Context) (err error) {
			s.accounts, err = shared.WatchAccounts(ctx, s.js, s.log, nil)
			return err
		}},
		shared.Step{What: "health", Run: func(ctx context.Context) (err error) {
			s.health, err = shared.WatchHealth(ctx, s.js, s.log)
			return err
		}},
		shared.Step{What: "suppressions", Run: func(ctx context.Context) (err error) {
			s.suppressed, err = s.cfg.Suppressions.View(ctx, s.js, s.log)
			return err
		}},
		shared.Step{What: "consumer", Run: func(ctx context.Context) (err error) {
			cons, err = s.js.CreateOrUpdateConsumer(ctx, contract.StreamRender, consumerConfig())
			return err
		}},
	)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	// Jobs and skipped events go out without waiting each (the batch waits
	// for all of them at its end).
	if s.pub, err = shared.NewPublisher(s.js.Conn(), maxPendingPublishes, publishTimeout); err != nil {
		return fmt.Errorf("render: %w", err)
	}
	defer s.pub.Close()
	s.log.Info("render started")
	return shared.Consume(ctx, cons, s.handle, shared.ConsumeConfig{
		Concurrency: s.cfg.Concurrency,
		AckWait:     ackWait,
		RetryDelay:  2 * time.Second,
		DeadLetter:  s.giveUp,
		Logger:      s.log,
	})
}

func (s *Service) handle(ctx context.Context, msg jetstream.Msg) error {
	var b contract.RenderBatch
	if err := contract.DecodeRenderBatch(msg.Data(), &b); err != nil {
		return shared.Permanent(fmt.Errorf("render batch: %w", err))
	}
	// The batch holds its recipients' share of RecipientsInFlight while
	// it renders (in-progress acks keep it while it waits).
	w := int64(min(max(len(b.Recipients), 1), s.cfg.RecipientsInFlight))
	if err := s.inFlight.Acquire(ctx, w); err != nil {
		return err
	}
	defer s.inFlight.Release(w)
	sp, err := s.spec(ctx, b.TaskID)
	if err != nil {
		return err
	}
	t := &sp.task
	// Paused accounts get no new work; if every account of the task is
	// paused, jobs still go to one of them and wait there (dispatch moves
	// them as soon as a healthy account exists), so the task's progress
	// shows why it waits.
	accounts := s.accounts.ForTask(t.Channel, t.Accounts)
	if usable := s.health.Usable(accounts); len(usable) > 0 {
		accounts = usable
	}
	if len(accounts) == 0 {
		return s.waitForAccount(ctx, t)
	}
	// A batch rendered before (redelivered, or published again by a resumed
	// expansion) may have jobs that exist already beyond the stream's
	// duplicate window, some of them sent: dispatch checks those.
	recheck := b.Resumed
	if meta, err := msg.Metadata(); err == nil && meta.NumDelivered > 1 {
		recheck = true
	}
	grouped := s.cfg.JobsPerMessage > 1
	groupingKey := contract.GroupingKey(t.ID, b.First, b.Test)
	var grouping *contract.Grouping
	if grouped && recheck {
		if grouping, err = s.readGrouping(ctx, groupingKey); err != nil {
			return err
		}
	}
	recorded := recordedAccounts(grouping, len(b.Recipients))
	var pending []renderedJob
	if grouped {
		pending = make([]renderedJob, 0, len(b.Recipients))
	}
	now := time.Now().UTC()
	htmlCh, _ := sp.channel.(channels.HTMLChannel)
	htmlAccounts := map[string]bool{} // account name -> sends HTML, asked once per batch
	picker := shared.NewPicker(accounts, s.health).Balance(len(b.Recipients), s.cfg.AccountSlack)
	futures := make([]*shared.Publication, 0, len(b.Recipients))
	rendered, skipped := 0, map[string]int{}
	var jobAccounts []string // the accounts of the batch's jobs, each once
	hasJob := map[string]bool{}
	category := t.Category
	if category == "" {
		category = contract.CategoryMarketing
	}
	// A zone in the task's defaults applies to recipients without their
	// own; dispatch judges quiet hours by it (contract.Job.TaskTZ). A
	// string longer than any zone name is not carried: it could only be
	// ignored, and would grow every job.
	taskTZ, _ := t.Defaults[policy.VarTZ].(string)
	if len(taskTZ) > maxZoneName {
		taskTZ = ""
	}
	for i, r := range b.Recipients {
		index := b.First + i
		jobID := contract.JobID(t.ID, index, b.Test)
		skip := func(code, reason string) error {
			f, err := s.pub.PublishEvent(ctx, &contract.Event{
				TaskID: t.ID, JobID: jobID, To: r.To, Kind: contract.EventSkipped,
				Index: index, Code: code, Error: reason, Class: contract.ClassPermanent,
			})
			if err == nil {
				futures = append(futures, f)
				skipped[code]++
			}
			return err
		}
		// The account is picked first: one that sends HTML gets the
		// recipient's variables escaped.
		acct := picker.Pick(r.To)
		accountName := acct.Name
		if recorded != nil && recorded[i] != "" {
			// Grouped before: the job goes where that rendering put it.
			accountName = recorded[i]
			if a := s.accounts.Get(accountName); a != nil {
				acct = a
			}
		}
		html, known := htmlAccounts[acct.Name]
		if !known && htmlCh != nil {
			html = htmlCh.HTMLBody(acct)
			htmlAccounts[acct.Name] = html
		}
		var perr error
		if r.Invalid != "" {
			perr = skip("invalid_recipient", r.Invalid)
		} else if hit, ok := s.suppressed.Lookup(t.Channel, r.To, category); ok {
			perr = skip(contract.CodeSuppressed, hit.Explain())
		} else if body, err := renderBody(sp.tmpl, t, r, html); err != nil {
			perr = skip("template", "template: "+err.Error())
		} else if err := sp.channel.CheckBody(body); err != nil {
			perr = skip("body", "body: "+err.Error())
		} else {
			job := contract.Job{
				ID: jobID, TaskID: t.ID, Index: index, To: r.To, Body: body,
				Channel: t.Channel, Account: accountName, Priority: t.Priority,
				MaxAttempts: t.MaxAttempts, ExpiresAt: t.ExpiryTime(), EnqueuedAt: now,
				Vars: r.Vars, TaskTZ: taskTZ, Test: b.Test, Recheck: recheck, Category: category,
			}
			job.SetPool(t.Accounts)
			setDigest(&job, t)
			if !hasJob[accountName] {
				hasJob[accountName] = true
				jobAccounts = append(jobAccounts, accountName)
			}
			if grouped {
				var data []byte
				if data, perr = s.encodeJob(&job); perr == nil {
					pending = append(pending, renderedJob{pos: i, account: job.Account, priority: job.Priority, msgID: job.MsgID(), data: data})
				}
			} else {
				perr = s.publishJob(ctx, &job, &futures)
			}
			if errors.Is(perr, errJobTooLarge) {
				perr = skip("too_large", perr.Error())
			} else {
				rendered++
			}
		}
		if perr != nil {
			return fmt.Errorf("publish: %w", perr)
		}
	}
	s.announce(jobAccounts)
	if grouped {
		if err := s.publishGrouped(ctx, groupingKey, grouping, pending, t.ID, b.First, b.Test, &futures); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	for _, f := range futures {
		if err := f.Wait(ctx); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	s.cfg.metrics.Rendered(rendered)
	for code, n := range skipped {
		s.cfg.metrics.Skipped(code, n)
	}
	return nil
}

// announce tells dispatch which accounts the batch's jobs go to, before
// they are stored (grouped jobs) or while they are (jobs alone), so it
// wakes the sleeping ones ahead of the jobs (contract.SubjectWake). A
// notice that cannot be sent is only logged: dispatch's lane finder sees
// the jobs anyway.
func (s *Service) announce(accounts []string) {
	for _, notice := range contract.WakeNotices(accounts) {
		if err := s.js.Conn().Publish(contract.SubjectWake, notice); err != nil {
			s.log.Debug("wake notice not sent", "err", err)
			return
		}
	}
}

// renderBody fills the task's template for r, with the variables
// HTML-escaped when the body goes out as HTML.
func renderBody(tmpl *contract.Template, t *contract.Task, r contract.BatchRecipient, html bool) (string, error) {
	if html {
		return tmpl.RenderEscaped(t.Defaults, r.Vars, r.To, htmlpkg.EscapeString)
	}
	return tmpl.Render(t.Defaults, r.Vars, r.To)
}

// maxZoneName is the longest zone name contract.LoadZone accepts.
const maxZoneName = 64

// A publish the stream has not acknowledged within publishTimeout fails,
// so its batch is retried rather than stuck; maxPendingPublishes bounds
// the unacknowledged ones over all batches in flight.
const (
	publishTimeout      = 30 * time.Second
	maxPendingPublishes = 1 << 16
)

// errJobTooLarge is a job that cannot fit the server's max_payload: its
// recipient is skipped with the reason, since retrying cannot help.
var errJobTooLarge = errors.New("job too large")

// encodeJob encodes job, or says it is too large for a message.
func (s *Service) encodeJob(job *contract.Job) ([]byte, error) {
	data, err := contract.EncodeJob(job)
	if err != nil {
		return nil, err
	}
	if max := s.js.Conn().MaxPayload(); int64(len(data))+jobHeaderBytes > max {
		return nil, fmt.Errorf("%w: the job is %d bytes, the server takes at most %d", errJobTooLarge, len(data), max)
	}
	return data, nil
}

// jobHeaderBytes covers a job's subject and Nats-Msg-Id header.
const jobHeaderBytes = 512

func (s *Service) publishJob(ctx context.Context, job *contract.Job, futures *[]*shared.Publication) error {
	data, err := s.encodeJob(job)
	if err != nil {
		return err
	}
	f, err := s.pub.Publish(ctx, contract.JobSubject(job.Account, job.Priority), data, job.MsgID())
	if err != nil {
		return err
	}
	*futures = append(*futures, f)
	return nil
}
