package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Tape is a recording of what a provider answered, per Idempotency-Key and
// attempt, that a Gateway plays back (Config.Tape) so that an incident can
// run again against new code. `broadcast tape TASK` writes one from a task's
// events and dead letters (package internal/tape).
//
// A request whose key and attempt (the body's "attempt") have an answer on
// the tape gets that answer after its latency; any other request is decided
// as without a tape (200 when no fault is configured).
type Tape struct {
	// Task is the task the tape was recorded from, for people reading it.
	Task string `json:"task,omitempty"`
	// Answers lists the recorded answers in the order they were given.
	Answers []TapeAnswer `json:"answers"`
}

// TapeAnswer is one recorded provider answer.
type TapeAnswer struct {
	// Key is the Idempotency-Key (the job id) the answer was given to.
	Key string `json:"key"`
	// To is the recipient, for people reading the tape.
	To string `json:"to,omitempty"`
	// Account is the account that sent the request.
	Account string `json:"account,omitempty"`
	// Attempt is the attempt number, 1 for the first.
	Attempt int `json:"attempt"`
	// Order is the answer's position among the task's answers, from 1.
	Order int `json:"order"`
	// Status is the HTTP status answered; 0 means no answer in time (a
	// timeout or a connection error), played back as a hang that ends in
	// 504 after Config.Hang.
	Status int `json:"status"`
	// Code is the outcome code as the events recorded it ("200", "429",
	// "timeout", "network", ...).
	Code string `json:"code,omitempty"`
	// RetryAfter is the Retry-After answered with a 429, when known.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Latency is how long the answer took; playback waits as long.
	Latency time.Duration `json:"latency,omitempty"`
	// Kind is the event kind that recorded the answer.
	Kind string `json:"kind,omitempty"`
}

type tapeKey struct {
	key     string
	attempt int
}

// ReadTape decodes a tape written as JSON.
func ReadTape(r io.Reader) (*Tape, error) {
	var t Tape
	if err := json.NewDecoder(r).Decode(&t); err != nil {
		return nil, fmt.Errorf("gateway: tape: %w", err)
	}
	if err := t.validate(); err != nil {
		return nil, fmt.Errorf("gateway: tape: %w", err)
	}
	return &t, nil
}

// keys returns how many answers t holds; 0 for a nil tape.
func (t *Tape) keys() int {
	if t == nil {
		return 0
	}
	return len(t.Answers)
}

// validate reports the first bad answer.
func (t *Tape) validate() error {
	if t == nil {
		return nil
	}
	for i, a := range t.Answers {
		switch {
		case a.Key == "":
			return fmt.Errorf("answers[%d].key: required", i)
		case a.Attempt < 1:
			return fmt.Errorf("answers[%d].attempt: %d is below 1", i, a.Attempt)
		case a.Status != 0 && (a.Status < 100 || a.Status > 599):
			return fmt.Errorf("answers[%d].status: %d is not an HTTP status", i, a.Status)
		case a.Latency < 0 || a.RetryAfter < 0:
			return fmt.Errorf("answers[%d]: negative latency or retry_after", i)
		}
	}
	return nil
}

// tapeIndex maps key and attempt to the answer; nil for a nil tape. A
// later answer for the same key and attempt wins.
func (t *Tape) tapeIndex() map[tapeKey]TapeAnswer {
	if t == nil {
		return nil
	}
	idx := make(map[tapeKey]TapeAnswer, len(t.Answers))
	for _, a := range t.Answers {
		idx[tapeKey{a.Key, a.Attempt}] = a
	}
	return idx
}

// tapeVerdict maps a recorded answer to the gateway's verdict and fault.
func tapeVerdict(a TapeAnswer) (verdict, fault, string) {
	switch {
	case a.Status >= 200 && a.Status < 300:
		return verdictAccept, 0, ""
	case a.Status == 0 || a.Status == http.StatusGatewayTimeout:
		return verdictFault, fault504, "taped timeout"
	case a.Status == http.StatusTooManyRequests:
		return verdictFault, fault429, "taped rate limit"
	case a.Status == http.StatusUnauthorized || a.Status == http.StatusForbidden:
		return verdictFault, fault401, "taped unauthorized"
	case a.Status >= 500 || a.Status == http.StatusRequestTimeout:
		return verdictFault, fault503, "taped failure"
	}
	return verdictFault, fault400, "taped rejection"
}
