package render

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// maxRawInDead bounds the raw batch kept in a dead letter's error.
const maxRawInDead = 8 << 10

// giveUp keeps a batch render will not try again (it does not decode, its
// task has no usable record): every recipient of it is skipped with the
// reason, so the task still ends and says why, and the batch goes to DEAD
// as one letter without a job (retry-dead keeps it, having nothing to
// re-send) for a person to inspect. The consume loop terminates the
// message once both are stored.
func (s *Service) giveUp(ctx context.Context, msg jetstream.Msg, cause error) error {
	taskID := contract.TaskFromSubject(msg.Subject())
	var b contract.RenderBatch
	decoded := json.Unmarshal(msg.Data(), &b) == nil && b.TaskID != ""
	if decoded {
		taskID = b.TaskID
	}
	if taskID == "" {
		taskID = "unknown"
	}
	reason := "render gave up on the batch: " + cause.Error()
	if decoded {
		futures := make([]*shared.Publication, 0, len(b.Recipients))
		for i, r := range b.Recipients {
			f, err := s.pub.PublishEvent(ctx, &contract.Event{
				TaskID: b.TaskID, JobID: contract.JobID(b.TaskID, b.First+i, b.Test), To: r.To, Kind: contract.EventSkipped,
				Index: b.First + i, Code: "render_failed", Error: reason, Class: contract.ClassPermanent,
			})
			if err != nil {
				return err
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			if err := f.Wait(ctx); err != nil {
				return err
			}
		}
	}
	raw := msg.Data()
	if len(raw) > maxRawInDead {
		raw = raw[:maxRawInDead]
		for len(raw) > 0 && !utf8.Valid(raw) {
			raw = raw[:len(raw)-1]
		}
	}
	dl := contract.DeadLetter{Job: contract.Job{TaskID: taskID}, Class: contract.ClassPermanent, Code: "render_failed",
		Error: fmt.Sprintf("%s; batch of %d recipients from index %d; raw batch: %s", reason, len(b.Recipients), b.First, raw),
		At:    time.Now().UTC()}
	data, err := json.Marshal(dl)
	if err != nil {
		return err
	}
	out := nats.NewMsg(contract.DeadSubject(taskID))
	out.Data = data
	if meta, err := msg.Metadata(); err == nil {
		out.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("render:%d", meta.Sequence.Stream))
	}
	if _, err := s.js.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	s.log.Error("render batch given up; its recipients are skipped and the batch is in DEAD", shared.KeyTaskID, taskID, "err", cause)
	return nil
}
