package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// retryDead puts a task's dead letters back in the queue through the same
// pacing as any job: a new generation of each job (so the stream does not
// drop it as a duplicate) with its attempts reset, and a requeued retrying
// event that moves the recipient from failed back to retrying. The dead
// letters re-queued are then purged; any that fail again are dead-lettered
// anew.
func (s *Service) retryDead(ctx context.Context, rec *shared.TaskRecord) (int, error) {
	stream, err := s.js.Stream(ctx, shared.StreamDead)
	if err != nil {
		return 0, err
	}
	subject := shared.DeadSubject(rec.Task.ID)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	pending := info.State.Subjects[subject]
	if pending == 0 {
		return 0, nil
	}
	cons, err := s.js.OrderedConsumer(ctx, shared.StreamDead, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return 0, err
	}
	var lastSeq uint64
	requeued := 0
	for read := uint64(0); read < pending; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return requeued, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			if meta, err := m.Metadata(); err == nil {
				lastSeq = meta.Sequence.Stream
			}
			var dl shared.DeadLetter
			if err := json.Unmarshal(m.Data(), &dl); err != nil || dl.Job.ID == "" {
				continue // a raw, undecodable job: nothing to re-send
			}
			if err := s.requeue(ctx, &dl.Job); err != nil {
				return requeued, err
			}
			requeued++
		}
		if got == 0 {
			break
		}
	}
	if lastSeq > 0 {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(lastSeq+1)); err != nil {
			return requeued, fmt.Errorf("purge re-queued dead letters: %w", err)
		}
	}
	return requeued, nil
}

// requeue publishes a new generation of job to a usable account of its pool.
func (s *Service) requeue(ctx context.Context, job *shared.Job) error {
	job.Generation++
	job.Attempts = 0
	if candidates := s.accounts.ForTask(job.Channel, job.Pool); len(candidates) > 0 {
		job.Account = shared.PickAccount(candidates, job.To, nil).Name
	}
	if err := shared.PublishEvent(ctx, s.js, &shared.Event{TaskID: job.TaskID, JobID: job.ID, To: job.To, Account: job.Account,
		Kind: shared.EventRetrying, Index: job.Index, Requeued: true, Code: "retry_dead", Error: "dead letter re-queued"}); err != nil {
		return err
	}
	data, err := json.Marshal(job)
	if err != nil {
		return err
	}
	_, err = s.js.Publish(ctx, shared.JobSubject(job.Account, job.Priority), data, jetstream.WithMsgID(job.MsgID()))
	return err
}
