package lease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
)

// TestConnWatchFollowsTheHandlers: a connection the server drops reads as
// down with one loss until the client is back, then up with the loss
// still counted; the handlers set before WatchConn keep running.
func TestConnWatchFollowsTheHandlers(t *testing.T) {
	t.Parallel()
	ts := natstest.Start(t)
	var before, beforeUp atomic.Int32
	nc, _ := ts.ConnectAs(t, natstest.Credentials{},
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { before.Add(1) }),
		nats.ReconnectHandler(func(*nats.Conn) { beforeUp.Add(1) }))
	w := WatchConn(nc)
	up, losses := w.State()
	require.True(t, up)
	require.Zero(t, losses)

	cid, err := nc.GetClientID()
	require.NoError(t, err)
	require.NoError(t, ts.Server.DisconnectClientByID(cid))
	// The client waits ReconnectWait before it dials the same server
	// again, so the drop is seen before the reconnect.
	natstest.Eventually(t, 5*time.Second, func() bool {
		up, losses := w.State()
		return !up && losses == 1
	}, "the drop reads as down with one loss")
	natstest.Eventually(t, 10*time.Second, func() bool {
		up, _ := w.State()
		return up
	}, "the reconnect reads as up")
	_, losses = w.State()
	require.EqualValues(t, 1, losses, "a loss stays counted after the reconnect")
	require.EqualValues(t, 1, before.Load(), "the earlier disconnect handler still runs")
	require.EqualValues(t, 1, beforeUp.Load(), "the earlier reconnect handler still runs")
	require.True(t, nc.IsConnected())
}
