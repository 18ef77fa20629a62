package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestMayFollowLostAnswer: a redelivered job is marked maybe_sent unless
// its own previous delivery left an outcome. The attempt number cannot
// tell: it repeats after a move that spent no attempt (an account problem
// is recorded, then the job moves on at the same attempt), and copies of
// one job share the ledger entry; judged by it, a send in flight when its
// process died could be forgotten. The scenario tester found a recipient
// the provider had reached counted expired with no maybe_sent after a
// kill -9 of dispatch (seed 502688736).
func TestMayFollowLostAnswer(t *testing.T) {
	t.Parallel()
	failed := func(attempt int, seq, n uint64) *ledgerEntry {
		le := &ledgerEntry{}
		le.addAttempt(contract.AttemptError{Attempt: attempt, Class: contract.ClassRetryable, Code: "500"}, seq, n)
		return le
	}
	cases := []struct {
		name string
		d    delivery
		want bool
	}{
		{"first delivery", delivery{seq: 7, delivered: 1, entry: &ledgerEntry{}}, false},
		{"redelivered after a recorded failure", delivery{seq: 7, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 7, 1)}, false},
		{"redelivered after a send in flight", delivery{seq: 7, delivered: 3, redelivered: true, attempt: 3, entry: failed(1, 7, 1)}, true},
		{"redelivered with nothing recorded", delivery{seq: 7, delivered: 2, redelivered: true, attempt: 2, entry: &ledgerEntry{}}, true},
		// The account problem was recorded at attempt 1 by message 5; the
		// moved job, message 9, sent attempt 1 again and its process died.
		{"moved at the same attempt", delivery{seq: 9, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 5, 1)}, true},
		{"another copy recorded last", delivery{seq: 9, delivered: 2, redelivered: true, attempt: 2, entry: failed(1, 8, 1)}, true},
		{"queued before its consumer lost its state", delivery{seq: 7, delivered: 1, recheck: true, attempt: 2, entry: failed(1, 7, 1)}, true},
	}
	for _, c := range cases {
		require.Equal(t, c.want, c.d.mayFollowLostAnswer(), c.name)
	}
}
