package channels

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/fakes"
)

// TestSMTPAsksTheGateOnceTheConnectionIsReady: a server slow to greet
// keeps the dial going after the sender's check; the gate shut meanwhile
// keeps the message from being written, whatever the account's
// connections (one per message, or shared, with and without CHUNKING),
// and one left open lets it go.
func TestSMTPAsksTheGateOnceTheConnectionIsReady(t *testing.T) {
	for _, c := range []struct {
		name  string
		mode  smtpMode
		extra string
	}{
		{"own connection", smtpMode{pipelining: true, chunking: true}, ""},
		{"shared, chunked", smtpMode{pipelining: true, chunking: true}, `,"connections":1`},
		{"shared, serial", smtpMode{}, `,"connections":1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := startSMTP(t, c.mode, fakes.SMTPConfig{GreetDelay: 300 * time.Millisecond})
			s := smtpSenderFor(t, smtpAccount(t, srv, c.extra))

			var open atomic.Bool
			open.Store(true)
			go func() {
				deadline := time.Now().Add(5 * time.Second)
				for srv.Counts().Connections == 0 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				open.Store(false) // while the server holds its greeting
			}()
			ctx := WithSendGate(context.Background(), open.Load)
			require.Equal(t, GateClosed, s.Send(ctx, []Message{mailTo("t1.0", "a@example.com", "hi")})[0])
			require.Zero(t, srv.Counts().Transactions)
			require.Empty(t, srv.Received())

			open.Store(true)
			r := s.Send(ctx, []Message{mailTo("t1.1", "b@example.com", "hi")})[0]
			require.True(t, r.OK(), "%+v", r)
			require.Len(t, srv.Received(), 1)
		})
	}
}
