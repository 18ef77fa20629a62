package shared

import (
	"errors"
	"fmt"
	"time"
)

// A handler steers the consume loop with what it returns:
//   - nil: the message is done; the loop acknowledges it.
//   - Permanent(err): never retry; the loop dead-letters (when the consumer
//     has a DeadLetter hook) and then terminates the message.
//   - RetryAfter(d, err): try again after d; the loop NAKs with that delay.
//   - Leave(err): leave the message as it is, neither acknowledged nor
//     NAKed: another delivery of it, still being handled, settles it.
//   - any other error: try again after the loop's default delay.

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	delay time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.delay, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter asks for the message to be delivered again after d.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &retryAfterError{delay: d, err: err}
}

// RetryDelay returns the delay requested with RetryAfter, if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}

type leaveError struct{ err error }

func (e *leaveError) Error() string { return e.err.Error() }
func (e *leaveError) Unwrap() error { return e.err }

// Leave asks the loop to leave the message unsettled: no ack, NAK or
// termination. It is for a redelivery that came while an earlier delivery
// of the same message is still being handled in this process (its
// progress reports came late): the server takes an ack, NAK or progress
// report of any delivery of a message (by its stream sequence), so the
// earlier one settles it, and if it does not, the message comes back after
// its ack wait. err says why, for the log.
func Leave(err error) error {
	if err == nil {
		err = errors.New("left to another delivery")
	}
	return &leaveError{err: err}
}

// IsLeave reports whether err was made by Leave.
func IsLeave(err error) bool {
	var l *leaveError
	return errors.As(err, &l)
}
