package shared_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/shared"
)

// TestSetUpRetriesWhatAServerRestartCauses: a start step that times out
// (the server restarting) is tried again until it works; one that fails
// otherwise is returned at once; a stop ends the tries.
func TestSetUpRetriesWhatAServerRestartCauses(t *testing.T) {
	ctx := context.Background()
	tries := 0
	err := shared.SetUp(ctx, logtest.Logger(), "consumer", func(context.Context) error {
		if tries++; tries < 3 {
			return context.DeadlineExceeded
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, tries, "tried until it worked")

	bad := errors.New("consumer: invalid configuration")
	tries = 0
	err = shared.SetUp(ctx, logtest.Logger(), "consumer", func(context.Context) error { tries++; return bad })
	require.ErrorIs(t, err, bad)
	require.Equal(t, 1, tries, "not tried again")

	stopped, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = shared.SetUp(stopped, logtest.Logger(), "consumer", func(context.Context) error { return nats.ErrNoResponders })
	require.ErrorIs(t, err, nats.ErrNoResponders)
	require.Less(t, time.Since(start), 2*time.Second, "ends with its context")
}

// TestSetUpAllNamesTheStepThatFailed: steps run in order, each tried
// again on a timeout; the first that fails otherwise ends the start with
// its name, and the steps after it do not run.
func TestSetUpAllNamesTheStepThatFailed(t *testing.T) {
	var ran []string
	timeouts := 1
	bad := errors.New("stream not found")
	err := shared.SetUpAll(context.Background(), logtest.Logger(),
		shared.Step{What: "buckets", Run: func(context.Context) error {
			ran = append(ran, "buckets")
			if timeouts > 0 {
				timeouts--
				return nats.ErrTimeout
			}
			return nil
		}},
		shared.Step{What: "consumer", Run: func(context.Context) error { ran = append(ran, "consumer"); return bad }},
		shared.Step{What: "watch", Run: func(context.Context) error { ran = append(ran, "watch"); return nil }},
	)
	require.ErrorIs(t, err, bad)
	require.EqualError(t, err, "consumer: stream not found")
	require.Equal(t, []string{"buckets", "buckets", "consumer"}, ran)
}
