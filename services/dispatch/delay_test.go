package dispatch

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestMoveJobBouncesAreNotDuplicates: a job moved A -> B -> A -> B without
// spending attempts (account problems spend none) is stored at every move,
// each the move of another message; the stream's duplicate window dropped
// the third move before, losing the job. A move repeated by a redelivery
// of one message is a duplicate.
func TestMoveJobBouncesAreNotDuplicates(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	job := contract.Job{ID: "bounce.0", TaskID: "bounce", To: "x", Channel: "webhook", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 5}
	path := []string{"b", "a", "b", "a"}
	var d *delivery
	for i, to := range path {
		d = &delivery{job: job, seq: uint64(100 + i), delivered: 1, attempt: 1, entry: &ledgerEntry{}}
		require.NoError(t, g.r.moveJob(ctx, d, to, 0))
		job.Account, job.Moves = to, job.Moves+1
	}
	stream, err := g.js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectJobsPrefix+">"))
	require.NoError(t, err)
	require.EqualValues(t, len(path), info.State.Msgs, "every move is stored")

	// A redelivered message moves again with the same id: deduplicated.
	d.delivered, d.attempt = 2, 2
	require.NoError(t, g.r.moveJob(ctx, d, "b", 1))
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(path), info.State.Msgs, "a repeated move of one message is a duplicate")
}
