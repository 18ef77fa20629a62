package suppress_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// TestViewAfterServerRestart: after a nats-server restart the view's watch
// starts over, so an entry added and one removed after the restart are
// both seen within a second, not after the watch's heartbeats time out.
func TestViewAfterServerRestart(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	srv, err := embedded.Start(embedded.Config{Port: port, StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Shutdown() })
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, shared.EnsureTopology(ctx, js, shared.TopologyConfig{}))
	list, err := suppress.Open(ctx, js)
	require.NoError(t, err)
	_, err = list.Put(ctx, "webhook", contract.Suppression{To: "old", Reason: contract.ReasonManual})
	require.NoError(t, err)
	view, err := suppress.Watch(ctx, js, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, ok := view.Lookup("webhook", "old", contract.CategoryMarketing)
	require.True(t, ok)

	srv.Shutdown()
	srv.WaitForShutdown()
	srv, err = embedded.Start(embedded.Config{Port: port, StoreDir: dir})
	require.NoError(t, err)
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)

	_, err = list.Put(ctx, "webhook", contract.Suppression{To: "new", Reason: contract.ReasonManual})
	require.NoError(t, err)
	_, err = list.Remove(ctx, "webhook", "old")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, hasNew := view.Lookup("webhook", "new", contract.CategoryMarketing)
		_, hasOld := view.Lookup("webhook", "old", contract.CategoryMarketing)
		return hasNew && !hasOld
	}, 2*time.Second, 5*time.Millisecond, "the view shows the writes made after the restart")
	require.Equal(t, 1, view.Len())
}
