package contract

import "time"

// DeadLetter is kept on broadcast.dead.<task> for every recipient given up
// on: the job as it was enqueued, the last error, and how it was classified.
type DeadLetter struct {
	Job      Job        `json:"job"`
	Account  string     `json:"account"`
	Attempts int        `json:"attempts"`
	Class    ErrorClass `json:"class"`
	Code     string     `json:"code"`
	Error    string     `json:"error"`
	At       time.Time  `json:"at"`
	// History holds the error of every attempt, oldest first, as far as
	// dispatch knows them.
	History []AttemptError `json:"history,omitempty"`
}

// AttemptError records one failed attempt.
type AttemptError struct {
	Attempt int        `json:"attempt"`
	Account string     `json:"account"`
	Class   ErrorClass `json:"class"`
	Code    string     `json:"code"`
	Error   string     `json:"error"`
	At      time.Time  `json:"at"`
}
