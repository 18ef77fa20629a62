package client

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// MaxFailuresRead bounds the dead letters and skipped events one Failures
// call reads (each); beyond it the groups say Truncated.
const MaxFailuresRead = 200_000

// FailureGroup is the failures of one kind, code and account: how many,
// and the first one as an example.
type FailureGroup struct {
	// Kind is "failed" (a dead letter: given up after its attempts) or
	// "skipped" (never attempted: bad address, missing variable,
	// suppressed).
	Kind    contract.EventKind `json:"kind"`
	Code    string             `json:"code"`
	Account string             `json:"account"`
	Count   int                `json:"count"`
	Example FailureExample     `json:"example"`
}

// FailureExample is one failure of a group.
type FailureExample struct {
	To    string    `json:"to"`
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

// Failures is GET /api/tasks/{id}/failures: a task's failures grouped,
// the largest group first.
type Failures struct {
	Task      string         `json:"task"`
	Groups    []FailureGroup `json:"groups"`
	Truncated bool           `json:"truncated,omitempty"`
}

// TaskFailures groups a task's dead letters (stream DEAD: those still
// given up on, not the ones retry-dead put back) and its skipped events
// by kind, code and account.
func TaskFailures(ctx context.Context, js jetstream.JetStream, taskID string) (*Failures, error) {
	if !contract.ValidID(taskID) {
		return nil, fmt.Errorf("task: %q must match [A-Za-z0-9_-]{1,64}", taskID)
	}
	out := &Failures{Task: taskID, Groups: []FailureGroup{}}
	type key struct {
		kind          contract.EventKind
		code, account string
	}
	index := map[key]int{}
	add := func(kind contract.EventKind, code, account string, ex FailureExample) {
		k := key{kind, code, account}
		i, ok := index[k]
		if !ok {
			i = len(out.Groups)
			index[k] = i
			out.Groups = append(out.Groups, FailureGroup{Kind: kind, Code: code, Account: account, Example: ex})
		}
		out.Groups[i].Count++
	}
	n := 0
	err := readSubject(ctx, js, contract.StreamDead, contract.DeadSubject(taskID), 0, func(_ uint64, data []byte) bool {
		var dl contract.DeadLetter
		if json.Unmarshal(data, &dl) == nil {
			add(contract.EventFailed, dl.Code, dl.Account, FailureExample{To: dl.Job.To, Error: dl.Error, At: dl.At})
		}
		n++
		return n < MaxFailuresRead
	})
	if err != nil {
		return nil, err
	}
	out.Truncated = n >= MaxFailuresRead
	n = 0
	err = readSubject(ctx, js, contract.StreamEvents, contract.EventSubject(taskID, contract.EventSkipped), 0, func(_ uint64, data []byte) bool {
		var ev contract.Event
		if contract.DecodeEvent(data, &ev) == nil && ev.Index >= 0 {
			add(contract.EventSkipped, ev.Code, ev.Account, FailureExample{To: ev.To, Error: ev.Error, At: ev.At})
		}
		n++
		return n < MaxFailuresRead
	})
	if err != nil {
		return nil, err
	}
	out.Truncated = out.Truncated || n >= MaxFailuresRead
	sort.SliceStable(out.Groups, func(i, j int) bool { return out.Groups[i].Count > out.Groups[j].Count })
	return out, nil
}

// MaxEventsPage bounds the events one TaskEvents call returns.
const MaxEventsPage = 500

// EventEntry is one event of a task with its sequence in EVENTS.
type EventEntry struct {
	Seq uint64 `json:"seq"`
	contract.Event
}

// EventsPage is a page of a task's events; Next is the sequence to ask
// for with after= for the following page (0 when this one is the last).
type EventsPage struct {
	Task   string       `json:"task"`
	Events []EventEntry `json:"events"`
	Next   uint64       `json:"next,omitempty"`
}

// TaskEvents returns up to limit (at most MaxEventsPage) of a task's
// events after stream sequence after, of one kind ("" for every kind),
// read from the task's own subjects.
func TaskEvents(ctx context.Context, js jetstream.JetStream, taskID string, kind contract.EventKind, after uint64, limit int) (*EventsPage, error) {
	switch {
	case !contract.ValidID(taskID):
		return nil, fmt.Errorf("task: %q must match [A-Za-z0-9_-]{1,64}", taskID)
	case kind != "" && !contract.ValidID(string(kind)):
		return nil, fmt.Errorf("kind: %q is not an event kind", kind)
	case limit < 1 || limit > MaxEventsPage:
		return nil, fmt.Errorf("limit: must be 1 to %d, got %d", MaxEventsPage, limit)
	}
	filter := contract.SubjectEventsPrefix + taskID + ".*"
	if kind != "" {
		filter = contract.EventSubject(taskID, kind)
	}
	page := &EventsPage{Task: taskID, Events: []EventEntry{}}
	err := readSubject(ctx, js, contract.StreamEvents, filter, after+1, func(seq uint64, data []byte) bool {
		e := EventEntry{Seq: seq}
		if contract.DecodeEvent(data, &e.Event) != nil {
			return true
		}
		page.Events = append(page.Events, e)
		if len(page.Events) == limit {
			page.Next = seq
			return false
		}
		return true
	})
	return page, err
}
