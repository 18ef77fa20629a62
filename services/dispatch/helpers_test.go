package dispatch

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// topologyJS starts a JetStream server with the topology and returns the
// test's client.
func topologyJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.StartWith(t, func(ctx context.Context, js jetstream.JetStream) error {
		return shared.EnsureTopology(ctx, js, shared.TopologyConfig{})
	}).JS
}
