package render

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// topologyJS starts an embedded server with the topology in place.
func topologyJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.StartWith(t, func(ctx context.Context, js jetstream.JetStream) error {
		return shared.EnsureTopology(ctx, js, shared.TopologyConfig{})
	}).JS
}

// runService starts render with cfg until the test ends.
func runService(t *testing.T, js jetstream.JetStream, cfg Config) *Service {
	t.Helper()
	svc, err := New(js, cfg)
	require.NoError(t, err)
	natstest.RunUntilCleanup(t, svc.Run)
	return svc
}
