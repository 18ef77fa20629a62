// Package topologytest starts a test's JetStream server (natstest) with
// Broadcast's topology in place: every stream and bucket the services
// need. It sits between shared and the services, so the services' own
// tests and the packages below them use it; pipelinetest, which starts
// the services, builds on it.
package topologytest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// Setup is the natstest.Setup that creates the topology from topo.
func Setup(topo shared.TopologyConfig) natstest.Setup {
	return func(ctx context.Context, js jetstream.JetStream) error {
		return shared.EnsureTopology(ctx, js, topo)
	}
}

// Start runs a JetStream server for the test with the default topology.
func Start(t testing.TB) *natstest.Server {
	t.Helper()
	return natstest.StartWith(t, Setup(shared.TopologyConfig{}))
}
