package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// submit publishes a task as JSON without a Nats-Msg-Id, so only ingest's
// own ledger can recognise a repeated id.
func submit(t *testing.T, ts *pipelinetest.Server, task any) {
	t.Helper()
	var data []byte
	switch v := task.(type) {
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		var err error
		data, err = json.Marshal(v)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ts.JS.Publish(ctx, contract.SubjectTasks, data)
	require.NoError(t, err)
}

// submitWithMsgID publishes raw bytes with a Nats-Msg-Id header.
func submitWithMsgID(t *testing.T, ts *pipelinetest.Server, data []byte, msgID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := nats.NewMsg(contract.SubjectTasks)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	_, err := ts.JS.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// countByKind tallies events per kind.
func countByKind(evs []contract.Event) map[contract.EventKind]int {
	out := map[contract.EventKind]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}
