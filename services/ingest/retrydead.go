package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// Re-queueing parked jobs (on resume and cancel) and dead letters
// (retry-dead) is done by dispatch, which is allowed to publish jobs; ingest
// is not (least privilege, nats.conf). Ingest asks on
// broadcast.requeue.<task> (contract/requeue.go) and dispatch's sweeper
// catches anything a lost request leaves parked.

// askRetryDead asks dispatch to re-queue the task's dead letters (those
// with the sequences seqs in DEAD, or all when seqs is empty) and returns
// how many it re-queued.
func (s *Service) askRetryDead(ctx context.Context, taskID string, seqs []uint64) (int, error) {
	reply, err := s.askRequeue(ctx, taskID, contract.RequeueRequest{Action: contract.RequeueDead, Seqs: seqs})
	if err != nil {
		return 0, err
	}
	return reply.Requeued, nil
}

// askUnpark asks dispatch to put the task's parked jobs back in their
// queues. It does not wait for the work, only for dispatch to take it.
func (s *Service) askUnpark(taskID string) {
	defer shared.Recover(s.log, "asking dispatch to unpark "+taskID, nil) // its sweeper does it
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.askRequeue(ctx, taskID, contract.RequeueRequest{Action: contract.RequeueParked}); err != nil {
		s.log.Warn("could not ask dispatch to re-queue parked jobs; its sweeper will", shared.KeyTaskID, taskID, "err", err)
	}
}

func (s *Service) askRequeue(ctx context.Context, taskID string, req contract.RequeueRequest) (*contract.RequeueReply, error) {
	action := req.Action
	data, _ := json.Marshal(req)
	msg, err := client.RequestAnswered(ctx, s.js.Conn(), contract.RequeueSubject(taskID), data)
	if err != nil {
		return nil, fmt.Errorf("ask dispatch to %s: %w", action, err)
	}
	var reply contract.RequeueReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("ask dispatch to %s: bad reply: %w", action, err)
	}
	if !reply.OK {
		return &reply, errors.New(reply.Error)
	}
	return &reply, nil
}
