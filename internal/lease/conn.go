package lease

import (
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// ConnWatch counts the losses of one connection, for Lease.Conn: a lease
// confirmed before a loss no longer counts as valid.
type ConnWatch struct {
	nc     *nats.Conn
	losses atomic.Uint64
}

// WatchConn counts every loss of nc's connection, beside the disconnect
// handler already set (which keeps running).
func WatchConn(nc *nats.Conn) *ConnWatch {
	w := &ConnWatch{nc: nc}
	prev := nc.DisconnectErrHandler()
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		w.losses.Add(1)
		if prev != nil {
			prev(c, err)
		}
	})
	return w
}

// State reports whether the connection is up and how often it was lost.
func (w *ConnWatch) State() (up bool, losses uint64) {
	return w.nc.IsConnected(), w.losses.Load()
}
