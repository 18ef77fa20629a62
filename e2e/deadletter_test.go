package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// deadLetters reads every dead letter of a task.
func deadLetters(t *testing.T, ts *pipelinetest.Server, taskID string) []contract.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ts.JS.OrderedConsumer(ctx, contract.StreamDead, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.DeadSubject(taskID)}})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []contract.DeadLetter
	for uint64(len(out)) < info.NumPending {
		b, err := c.Fetch(int(min(100, info.NumPending-uint64(len(out)))), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range b.Messages() {
			var d contract.DeadLetter
			require.NoError(t, json.Unmarshal(m.Data(), &d))
			out = append(out, d)
		}
	}
	return out
}
