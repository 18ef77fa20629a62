package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// giveUp describes a job dispatch will not attempt again.
type giveUp struct {
	job     *contract.Job
	attempt int
	account string
	class   contract.ErrorClass
	code    string
	err     string
	history []contract.AttemptError
	// callShared: see contract.Event.CallShared.
	callShared bool
	// callStarted is when the last provider call began, if the give-up
	// followed one (contract.Event.CallStartedAt).
	callStarted time.Time
}

func (g *giveUp) Error() string { return fmt.Sprintf("%s (%s): %s", g.class, g.code, g.err) }

// deadLetter keeps a given-up job in DEAD, then publishes its failed event.
// The consume loop terminates the message only after both are stored.
func (s *Service) deadLetter(ctx context.Context, msg jetstream.Msg, cause error) error {
	var g *giveUp
	if !errors.As(cause, &g) {
		g = &giveUp{class: contract.ClassPermanent, code: "error", err: cause.Error()}
	}
	now := time.Now().UTC()
	dl := contract.DeadLetter{Account: g.account, Attempts: g.attempt, Class: g.class, Code: g.code, Error: g.err, At: now, History: g.history}
	taskID := contract.TaskFromSubject(msg.Subject())
	salvaged := salvage(msg.Data())
	if g.job != nil {
		dl.Job = *g.job
		taskID = g.job.TaskID
	} else if salvaged.ok() {
		taskID = salvaged.TaskID
	}
	if taskID == "" {
		taskID = "unknown"
	}
	data, err := json.Marshal(dl)
	if err != nil {
		return err
	}
	out := nats.NewMsg(contract.DeadSubject(taskID))
	if g.job != nil {
		out.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s:dead:%d", g.job.MsgID(), g.attempt))
	} else {
		// An undecodable job keeps its raw bytes so a person can see it.
		dl.Error += "; raw job: " + string(msg.Data())
		data, _ = json.Marshal(dl)
	}
	out.Data = data
	if _, err := s.js.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	if g.job == nil {
		if !salvaged.ok() {
			s.log.Error("undecodable job kept in DEAD under \"unknown\"; no task to report it to", "err", g.err)
			return nil
		}
		// Its task still ends: the failed event is read from what decodes
		// (a field of the wrong type leaves the others readable).
		return s.publish(ctx, &contract.Event{TaskID: salvaged.TaskID, JobID: salvaged.ID, To: salvaged.To, Kind: contract.EventFailed,
			Index: *salvaged.Index, Class: g.class, Code: g.code, Error: g.err, At: now})
	}
	return s.publish(ctx, &contract.Event{TaskID: g.job.TaskID, JobID: g.job.ID, To: g.job.To, Account: g.account,
		Kind: contract.EventFailed, Attempt: g.attempt, Index: g.job.Index, Class: g.class, Code: g.code, Error: g.err, At: now,
		CallShared: g.callShared, Generation: g.job.Generation, MaybeSent: g.job.MaybeSent, CallStartedAt: g.callStarted.UTC()})
}

// salvaged is what can be read of an undecodable job.
type salvaged struct {
	ID     string `json:"id"`
	TaskID string `json:"task_id"`
	Index  *int   `json:"index"`
	To     string `json:"to"`
}

func (p salvaged) ok() bool { return contract.ValidID(p.TaskID) && p.Index != nil && *p.Index >= 0 }

func salvage(raw []byte) salvaged {
	var p salvaged
	_ = json.Unmarshal(raw, &p)
	return p
}
