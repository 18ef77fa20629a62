package lease

import (
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// ConnWatch counts the losses of one connection, for Lease.Conn: a lease
// confirmed before a loss no longer counts as valid.
type ConnWatch struct {
	losses atomic.Uint64
	down   atomic.Bool // from a disconnect until the reconnect
}

// WatchConn counts every loss of nc's connection and notes whether it is
// down, beside the disconnect and reconnect handlers already set (which
// keep running).
func WatchConn(nc *nats.Conn) *ConnWatch {
	w := &ConnWatch{}
	prev := nc.DisconnectErrHandler()
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		w.down.Store(true)
		w.losses.Add(1)
		if prev != nil {
			prev(c, err)
		}
	})
	prevUp := nc.ReconnectHandler()
	nc.SetReconnectHandler(func(c *nats.Conn) {
		w.down.Store(false)
		if prevUp != nil {
			prevUp(c)
		}
	})
	w.down.Store(!nc.IsConnected())
	return w
}

// State reports whether the connection is up and how often it was lost,
// as the connection's handlers last said. Every account's scheduler asks
// at each grant, so it reads atomics rather than the connection, whose
// lock every publish of the process takes.
func (w *ConnWatch) State() (up bool, losses uint64) {
	return !w.down.Load(), w.losses.Load()
}
