package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// topologyJS starts a JetStream server with the topology.
func topologyJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	s, err := embedded.Start(embedded.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shared.EnsureTopology(ctx, js, shared.TopologyConfig{}))
	return js
}
