package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// MaxDeadPage bounds the dead letters one DeadLetters call returns, and
// MaxDeadOffset how far into a task's dead letters a page may start (a
// page is found by reading the letters before it).
const (
	MaxDeadPage   = 500
	MaxDeadOffset = 100_000
)

// DeadEntry is one dead letter as the dashboard and `broadcast dead` show
// it: who, through which account, every attempt's code and error, and
// when it was given up on. Seq is its sequence in stream DEAD, which
// names it for a retry of a selection.
type DeadEntry struct {
	Seq      uint64                  `json:"seq"`
	JobID    string                  `json:"job_id"`
	To       string                  `json:"to"`
	Account  string                  `json:"account"`
	Code     string                  `json:"code"`
	Error    string                  `json:"error"`
	Class    contract.ErrorClass     `json:"class,omitempty"`
	At       time.Time               `json:"at"`
	Attempts []contract.AttemptError `json:"attempts"`
}

// DeadPage is one page of a task's dead letters, oldest first; Total is
// how many the task has.
type DeadPage struct {
	Task    string      `json:"task"`
	Total   int         `json:"total"`
	Offset  int         `json:"offset"`
	Letters []DeadEntry `json:"letters"`
}

// entryOf turns a stored dead letter into a DeadEntry. A letter without
// its attempt history (older dispatches, render's) shows its last error
// as its one attempt.
func entryOf(seq uint64, dl *contract.DeadLetter) DeadEntry {
	e := DeadEntry{Seq: seq, JobID: dl.Job.ID, To: dl.Job.To, Account: dl.Account, Code: dl.Code, Error: dl.Error,
		Class: dl.Class, At: dl.At, Attempts: dl.History}
	if len(e.Attempts) == 0 {
		e.Attempts = []contract.AttemptError{{Attempt: dl.Attempts, Account: dl.Account, Class: dl.Class, Code: dl.Code, Error: dl.Error, At: dl.At}}
	}
	return e
}

// DeadLetters returns limit (at most MaxDeadPage) of a task's dead letters
// from offset (at most MaxDeadOffset), oldest first.
func DeadLetters(ctx context.Context, js jetstream.JetStream, taskID string, offset, limit int) (*DeadPage, error) {
	switch {
	case !contract.ValidID(taskID):
		return nil, fmt.Errorf("task: %q must match [A-Za-z0-9_-]{1,64}", taskID)
	case offset < 0 || offset > MaxDeadOffset:
		return nil, fmt.Errorf("offset: must be 0 to %d, got %d", MaxDeadOffset, offset)
	case limit < 1 || limit > MaxDeadPage:
		return nil, fmt.Errorf("limit: must be 1 to %d, got %d", MaxDeadPage, limit)
	}
	subject := contract.DeadSubject(taskID)
	page := &DeadPage{Task: taskID, Offset: offset, Letters: []DeadEntry{}}
	stream, err := js.Stream(ctx, contract.StreamDead)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return nil, err
	}
	page.Total = int(info.State.Subjects[subject])
	if offset >= page.Total {
		return page, nil
	}
	i := 0
	err = readSubject(ctx, js, contract.StreamDead, subject, 0, func(seq uint64, data []byte) bool {
		if i++; i <= offset {
			return true
		}
		var dl contract.DeadLetter
		if json.Unmarshal(data, &dl) != nil {
			dl = contract.DeadLetter{Error: "dead letter does not decode"}
		}
		page.Letters = append(page.Letters, entryOf(seq, &dl))
		return len(page.Letters) < limit
	})
	return page, err
}

// DeadLetter returns one dead letter of a task by its sequence in DEAD.
func DeadLetter(ctx context.Context, js jetstream.JetStream, taskID string, seq uint64) (*DeadEntry, error) {
	stream, err := js.Stream(ctx, contract.StreamDead)
	if err != nil {
		return nil, err
	}
	m, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	if m.Subject != contract.DeadSubject(taskID) {
		return nil, fmt.Errorf("dead letter %d: is not task %s's", seq, taskID)
	}
	var dl contract.DeadLetter
	if err := json.Unmarshal(m.Data, &dl); err != nil {
		return nil, fmt.Errorf("dead letter %d: does not decode: %w", seq, err)
	}
	e := entryOf(seq, &dl)
	return &e, nil
}
