package pipelinetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// Events returns every event of a task stored in EVENTS, in stream order.
func (ts *Server) Events(t testing.TB, taskID string) []contract.Event {
	t.Helper()
	return ts.events(t, contract.SubjectEventsPrefix+taskID+".>")
}

// AllEvents returns every event in EVENTS, in stream order.
func (ts *Server) AllEvents(t testing.TB) []contract.Event {
	t.Helper()
	return ts.events(t, contract.SubjectEventsPrefix+">")
}

func (ts *Server) events(t testing.TB, filter string) []contract.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ts.JS.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
	})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []contract.Event
	pending := info.NumPending
	for uint64(len(out)) < pending {
		// Ask for no more than are pending: a fetch of more waits out its
		// whole MaxWait.
		batch, err := c.Fetch(int(min(500, pending-uint64(len(out)))), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			var ev contract.Event
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			out = append(out, ev)
		}
		require.NoError(t, batch.Error())
	}
	return out
}
