package status

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func ev(kind contract.EventKind, index, attempt int) *contract.Event {
	return &contract.Event{TaskID: "t", JobID: contract.JobID("t", index, false), Kind: kind, Index: index, Attempt: attempt, At: time.Now()}
}

// TestFoldIsExactUnderRedeliveryAndDuplicates replays a task's event log
// with random duplicates and redeliveries of earlier events, and checks the
// counts equal those of the clean log.
func TestFoldIsExactUnderRedeliveryAndDuplicates(t *testing.T) {
	t.Parallel()
	const n = 500
	var log []*contract.Event
	log = append(log, &contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: n, Duplicates: 3, At: time.Now()})
	for i := range n {
		switch i % 10 {
		case 0:
			log = append(log, ev(contract.EventSkipped, i, 0))
		case 1:
			log = append(log, ev(contract.EventRetrying, i, 1), ev(contract.EventRetrying, i, 2), ev(contract.EventFailed, i, 3))
		case 2, 3:
			log = append(log, ev(contract.EventRetrying, i, 1), ev(contract.EventSent, i, 2))
		default:
			log = append(log, ev(contract.EventSent, i, 1))
		}
	}
	clean := newFold("t")
	for _, e := range log {
		clean.apply(e)
	}
	require.Equal(t, n, clean.P.Total)
	require.Equal(t, 3, clean.P.Duplicates)
	require.Equal(t, 50, clean.P.Skipped)
	require.Equal(t, 50, clean.P.Failed)
	require.Equal(t, 400, clean.P.Sent)
	require.Equal(t, 0, clean.P.Retrying)
	require.Equal(t, contract.StatePartial, clean.P.State)

	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		noisy := newFold("t")
		for i, e := range log {
			noisy.apply(e)
			// Redeliver an earlier event now and then, and duplicate this one.
			if rng.IntN(3) == 0 {
				noisy.apply(log[rng.IntN(i+1)])
			}
			if rng.IntN(5) == 0 {
				noisy.apply(e)
			}
		}
		require.Equal(t, clean.P.Sent, noisy.P.Sent, "round %d", round)
		require.Equal(t, clean.P.Failed, noisy.P.Failed, "round %d", round)
		require.Equal(t, clean.P.Skipped, noisy.P.Skipped, "round %d", round)
		require.Equal(t, 0, noisy.P.Retrying, "round %d", round)
		require.Equal(t, clean.P.State, noisy.P.State, "round %d", round)
	}
}

func TestFoldRetryingIsAGauge(t *testing.T) {
	t.Parallel()
	f := newFold("t")
	f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 3})
	f.apply(ev(contract.EventRetrying, 0, 1))
	f.apply(ev(contract.EventRetrying, 1, 1))
	f.apply(ev(contract.EventRetrying, 1, 2))
	require.Equal(t, 2, f.P.Retrying)
	f.apply(ev(contract.EventSent, 0, 2))
	require.Equal(t, 1, f.P.Retrying)
	require.Equal(t, contract.StateProcessing, f.P.State)
	f.apply(ev(contract.EventFailed, 1, 3))
	f.apply(ev(contract.EventSent, 2, 1))
	require.Equal(t, 0, f.P.Retrying)
	require.Equal(t, contract.StatePartial, f.P.State)
	require.NotNil(t, f.P.FinishedAt)
}

// TestFoldTimesAreTheOutcomesFirstAndLast: a sent event stored late with
// an early time (a job redelivered after its send publishes its sent
// event again, with the send's time) neither ends the task at that time
// nor leaves started_at after an earlier send.
func TestFoldTimesAreTheOutcomesFirstAndLast(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	at := func(e *contract.Event, d time.Duration) *contract.Event { e.At = t0.Add(d); return e }
	f := newFold("t")
	f.apply(at(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 3}, 0))
	f.apply(at(ev(contract.EventSent, 1, 1), 2*time.Second))
	f.apply(at(ev(contract.EventSent, 2, 1), 7*time.Second))
	f.apply(at(ev(contract.EventSent, 0, 1), time.Second))
	require.Equal(t, contract.StateSucceeded, f.P.State)
	require.Equal(t, t0.Add(time.Second), *f.P.StartedAt)
	require.Equal(t, t0.Add(7*time.Second), *f.P.FinishedAt)
}

func TestFoldFinalStates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kinds []contract.EventKind
		want  contract.TaskState
	}{
		{[]contract.EventKind{contract.EventSent, contract.EventSent}, contract.StateSucceeded},
		{[]contract.EventKind{contract.EventSent, contract.EventSkipped}, contract.StatePartial},
		{[]contract.EventKind{contract.EventFailed, contract.EventSkipped}, contract.StateFailed},
		{[]contract.EventKind{contract.EventSent, contract.EventCancelled}, contract.StateCancelled},
	} {
		f := newFold("t")
		f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: len(c.kinds)})
		for i, k := range c.kinds {
			require.Equal(t, contract.StateProcessing, f.P.State)
			f.apply(ev(k, i, 1))
		}
		require.Equal(t, c.want, f.P.State, "%v", c.kinds)
	}
}

func TestFoldIgnoresIndexBeyondTotalAndRejectAfterAccept(t *testing.T) {
	t.Parallel()
	f := newFold("t")
	f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 2})
	require.False(t, f.apply(ev(contract.EventSent, 5, 1)))
	require.False(t, f.apply(&contract.Event{TaskID: "t", Kind: contract.EventRejected, Index: -1, Error: "x"}))
	require.Equal(t, 0, f.P.Sent)
	require.Equal(t, contract.StateProcessing, f.P.State)
}

// TestFoldWaitReasonWhileAnyWaits: the reason of a daily-cap wait shows
// while any recipient waits, also when sends that were in flight at the cap
// report after it (they cleared it before), and goes once none waits.
func TestFoldWaitReasonWhileAnyWaits(t *testing.T) {
	t.Parallel()
	f := newFold("t")
	f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 4})
	wait := func(i int, code, reason string) *contract.Event {
		e := ev(contract.EventRetrying, i, 0)
		e.Code, e.Error = code, reason
		return e
	}
	f.apply(ev(contract.EventSent, 0, 1))
	require.True(t, f.apply(wait(2, "daily_cap", "daily_cap 2 reached on account a")))
	require.True(t, f.apply(wait(3, "daily_cap", "daily_cap 2 reached on account a")))
	f.apply(ev(contract.EventSent, 1, 1)) // in flight when the cap was reached
	f.refresh(time.Now(), contract.Control{})
	require.Equal(t, "waiting: daily_cap 2 reached on account a", f.P.Error)
	require.Equal(t, 2, f.P.Retrying)
	require.Equal(t, 2, f.Waiting)

	require.False(t, f.apply(wait(3, "daily_cap", "daily_cap 2 reached on account a")), "a repeated wait changes nothing")
	require.True(t, f.apply(wait(3, "no_healthy_account", "account a is disabled")), "a new reason is news")
	f.apply(ev(contract.EventRetrying, 2, 1)) // woken, then a 503: retrying, not waiting
	require.Equal(t, 1, f.Waiting)
	require.Equal(t, 2, f.P.Retrying)
	f.refresh(time.Now(), contract.Control{})
	require.Equal(t, "waiting: account a is disabled", f.P.Error)

	f.apply(ev(contract.EventSent, 3, 1))
	f.refresh(time.Now(), contract.Control{})
	require.Zero(t, f.Waiting)
	require.Empty(t, f.P.Error, "nobody waits any more")
	f.apply(ev(contract.EventSent, 2, 2))
	require.Equal(t, contract.StateSucceeded, f.P.State)
	require.Zero(t, f.P.Retrying)
}

// TestFoldTaskWaitUntilARecipientMoves: render's task-level wait (no
// enabled account) shows in progress.error, counts no recipient, and is
// gone once any recipient's event arrives.
func TestFoldTaskWaitUntilARecipientMoves(t *testing.T) {
	t.Parallel()
	f := newFold("t")
	f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 2})
	hold := &contract.Event{TaskID: "t", Kind: contract.EventRetrying, Index: -1, Code: contract.CodeNoEnabledAccount, Error: "no enabled account among a"}
	require.True(t, f.apply(hold))
	require.False(t, f.apply(hold), "the same reason again changes nothing")
	f.refresh(time.Now(), contract.Control{})
	require.Equal(t, "waiting: no enabled account among a", f.P.Error)
	require.Zero(t, f.P.Retrying, "no recipient is counted")
	require.Equal(t, contract.StateProcessing, f.P.State)

	f.refresh(time.Now(), contract.Control{State: contract.StatePaused, Reason: "operator"})
	require.Equal(t, "paused: operator", f.P.Error, "a pause says more than the wait")

	f.apply(ev(contract.EventSent, 0, 1))
	f.refresh(time.Now(), contract.Control{})
	require.Empty(t, f.P.Error)
	f.apply(ev(contract.EventSent, 1, 1))
	require.Equal(t, contract.StateSucceeded, f.P.State)
}
