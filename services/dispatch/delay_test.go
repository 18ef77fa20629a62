package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestMoveJobBouncesAreNotDuplicates: a job moved A -> B -> A -> B without
// spending attempts (account problems spend none) is stored at every move;
// the stream's duplicate window dropped the third move before, losing the
// job.
func TestMoveJobBouncesAreNotDuplicates(t *testing.T) {
	js := topologyJS(t)
	s := &Service{js: js}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job := contract.Job{ID: "bounce.0", TaskID: "bounce", To: "x", Channel: "webhook", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 5}
	path := []string{"b", "a", "b", "a"}
	for _, to := range path {
		require.NoError(t, s.moveJob(ctx, &job, to, 0))
		job.Account, job.Moves = to, job.Moves+1
	}
	stream, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectJobsPrefix+">"))
	require.NoError(t, err)
	require.EqualValues(t, len(path), info.State.Msgs, "every move is stored")

	// A redelivered message moves again with the same id: deduplicated.
	job.Moves--
	require.NoError(t, s.moveJob(ctx, &job, "a", 0))
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(path), info.State.Msgs, "a repeated move of one message is a duplicate")
}
