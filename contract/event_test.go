package contract

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEventMsgIDGenerations: the failed outcome of a re-queued job's first
// attempt must not share its Nats-Msg-Id with the first generation's, or
// the EVENTS stream drops it as a duplicate and the task never becomes
// final (found by the scenario tester, seed 8).
func TestEventMsgIDGenerations(t *testing.T) {
	t.Parallel()
	first := Event{TaskID: "t", JobID: "t.4", Kind: EventFailed, Attempt: 1}
	again := first
	again.Generation = 1
	require.Equal(t, "t.4:failed:1", first.MsgID(), "generation 0 keeps the id it always had")
	require.NotEqual(t, first.MsgID(), again.MsgID())
	again2 := again
	again2.Generation = 2
	require.NotEqual(t, again.MsgID(), again2.MsgID())
}

// TestEventMsgIDMaybeSent: an outcome saying an earlier send may have
// reached the recipient must be stored even when the same outcome, at the
// same attempt, was stored without it (two copies of a job in flight).
func TestEventMsgIDMaybeSent(t *testing.T) {
	t.Parallel()
	plain := Event{TaskID: "t", JobID: "t.4", Kind: EventExpired, Attempt: 2}
	maybe := plain
	maybe.MaybeSent = true
	require.Equal(t, "t.4:expired:2", plain.MsgID())
	require.NotEqual(t, plain.MsgID(), maybe.MsgID())
	maybe.Generation = 1
	require.Equal(t, "t.4:expired:2:g1:maybe", maybe.MsgID())
}

// TestEventMsgIDDelivery: attempt numbers repeat across copies of a job (a
// move spends no attempt), so outcomes of one attempt told by different
// messages must not share an id; the same outcome told again by a
// redelivery of the same message (after a crash) does.
func TestEventMsgIDDelivery(t *testing.T) {
	t.Parallel()
	before := Event{TaskID: "t", JobID: "t.4", Kind: EventRetrying, Attempt: 1, JobSeq: 7, Delivery: 1}
	moved := before
	moved.JobSeq = 9
	again := before
	again.Delivery = 2
	require.Equal(t, "t.4:retrying:1:s7", before.MsgID())
	require.NotEqual(t, before.MsgID(), moved.MsgID())
	require.Equal(t, before.MsgID(), again.MsgID(), "a redelivery telling the same outcome")
	same := before
	same.Code = "503"
	require.Equal(t, before.MsgID(), same.MsgID(), "the same delivery's outcome again")
	plain := Event{TaskID: "t", JobID: "t.4", Kind: EventRetrying, Attempt: 1}
	require.Equal(t, "t.4:retrying:1", plain.MsgID(), "no delivery: the id it always had")
}
