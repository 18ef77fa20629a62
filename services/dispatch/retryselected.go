package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// retryDeadSelected re-queues the task's dead letters with the given
// sequences in DEAD, and only those (the dashboard's "retry these"), and
// removes each from DEAD once its job is back in a queue. A sequence that
// is gone (retried already, or past retention) is passed over; one that
// is another task's, or has no job to re-send, is an error naming it,
// after the ones before it were re-queued.
func (s *Service) retryDeadSelected(ctx context.Context, taskID string, seqs []uint64) (int, error) {
	stream, err := s.js.Stream(ctx, contract.StreamDead)
	if err != nil {
		return 0, err
	}
	subject := contract.DeadSubject(taskID)
	seen := map[uint64]bool{}
	requeued := 0
	for _, seq := range seqs {
		if seen[seq] {
			continue
		}
		seen[seq] = true
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return requeued, fmt.Errorf("seqs: dead letter %d: %w", seq, err)
		}
		if m.Subject != subject {
			return requeued, fmt.Errorf("seqs: %d is not a dead letter of task %s", seq, taskID)
		}
		var dl contract.DeadLetter
		if err := json.Unmarshal(m.Data, &dl); err != nil || dl.Job.ID == "" {
			return requeued, fmt.Errorf("seqs: dead letter %d has no job to re-send", seq)
		}
		if err := s.requeue(ctx, &dl.Job); err != nil {
			return requeued, err
		}
		// Deleted after the job is queued: a crash between the two leaves
		// the letter, and retrying it again re-queues a job the ledger
		// then finds sent (or sends once).
		if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return requeued + 1, fmt.Errorf("remove re-queued dead letter %d: %w", seq, err)
		}
		requeued++
	}
	return requeued, nil
}
