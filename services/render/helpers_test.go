package render

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
)

// runService starts render with cfg until the test ends.
func runService(t *testing.T, js jetstream.JetStream, cfg Config) *Service {
	t.Helper()
	svc, err := New(js, cfg)
	require.NoError(t, err)
	natstest.RunUntilCleanup(t, svc.Run)
	return svc
}
