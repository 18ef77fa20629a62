package dispatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestLedgerWriteKeepsAnotherMessagesGuards: two messages of one job (an
// original and its copy after a crash) write its entry from what each
// read. The later write, from an entry read before the other's, keeps the
// copy's record and its claim, and a write from nothing read (a first
// delivery's, a sent event not stored) keeps them too: a plain overwrite
// erased the claim, and a second copy of the job would then send.
func TestLedgerWriteKeepsAnotherMessagesGuards(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	job := &contract.Job{ID: contract.JobID("guards", 0, false), TaskID: "guards", Account: "a"}
	first := &ledgerEntry{Handoffs: []handoff{{Seq: 7, MsgID: "guards:0:delay:7", Account: "a", Attempts: 1}}}
	first.addAttempt(contract.AttemptError{Attempt: 1, Account: "a", Code: "timeout", At: time.Now().UTC()}, 7, 1, true)
	require.NoError(t, g.svc.writeLedger(ctx, job, first))

	stale, err := g.svc.readLedger(ctx, job) // the original, redelivered, reads
	require.NoError(t, err)
	claimer, err := g.svc.readLedger(ctx, job) // the copy claims the record
	require.NoError(t, err)
	claimer.Handoffs[0].Claimed = 9
	require.NoError(t, g.svc.writeLedger(ctx, job, claimer))

	stale.addAttempt(contract.AttemptError{Attempt: 2, Account: "a", Code: "rate_limited", At: time.Now().UTC()}, 7, 2, false)
	require.NoError(t, g.svc.writeLedger(ctx, job, stale))
	got, err := g.svc.readLedger(ctx, job)
	require.NoError(t, err)
	require.Len(t, got.Handoffs, 1)
	require.Equal(t, uint64(9), got.Handoffs[0].Claimed, "the claim survives a write from an entry read before it")
	require.Equal(t, []int{1, 2}, []int{got.History[0].Attempt, got.History[1].Attempt})
	require.Equal(t, uint64(2), got.Delivery, "the later write's outcome is the entry's")
	require.True(t, got.MaybeSent)

	fresh := &ledgerEntry{State: "sent", Account: "a", Attempt: 3, At: time.Now().UTC()}
	require.NoError(t, g.svc.writeLedger(ctx, job, fresh))
	got, err = g.svc.readLedger(ctx, job)
	require.NoError(t, err)
	require.Equal(t, "sent", got.State)
	require.Len(t, got.Handoffs, 1)
	require.Equal(t, uint64(9), got.Handoffs[0].Claimed, "a write from nothing read keeps the claim")
	require.True(t, got.mayHaveReached(), "the timed-out attempt is kept")
}

// TestKeepGuards: what a stored entry holds against a repeat is taken into
// the entry written over it.
func TestKeepGuards(t *testing.T) {
	t.Parallel()
	stored := &ledgerEntry{State: "sent", Account: "b", Attempt: 2, ProviderID: "p-1", GivenUp: true, Generation: 1, rev: 5,
		Handoffs: []handoff{{MsgID: "m1", Claimed: 3}, {MsgID: "m2"}}}
	le := &ledgerEntry{State: "retrying", Account: "a", Attempt: 4, Seq: 11, Delivery: 2,
		Handoffs: []handoff{{MsgID: "m2", Claimed: 12}, {MsgID: "m3"}, {MsgID: "m4"}, {MsgID: "m5"}}}
	le.keepGuards(stored)
	require.Equal(t, uint64(5), le.rev)
	require.Equal(t, "sent", le.State)
	require.Equal(t, "p-1", le.ProviderID)
	require.True(t, le.GivenUp)
	require.Equal(t, 1, le.Generation)
	require.Equal(t, uint64(11), le.Seq)
	var ids []string
	for _, h := range le.Handoffs {
		ids = append(ids, h.MsgID)
	}
	require.Equal(t, []string{"m2", "m3", "m4", "m5"}, ids, "the newest maxHandoffs records")
	require.Equal(t, uint64(12), le.Handoffs[0].Claimed, "a claim of the entry written is kept")

	newer := &ledgerEntry{GivenUp: true, Generation: 2}
	newer.keepGuards(&ledgerEntry{GivenUp: true, Generation: 1})
	require.Equal(t, 2, newer.Generation, "a later generation's give-up is not replaced by an earlier one")
}
