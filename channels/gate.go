package channels

import (
	"context"

	"github.com/broadcastd/broadcast/contract"
)

// A send gate is the sender's last word on whether a message may still go
// out (dispatch: whether the account's lease is still confirmed). The
// check before a provider call cannot see what the call then waits for
// before the message leaves: a connection to dial, a server slow to
// greet, a place on a shared connection. A channel that can wait there
// asks the gate again once the connection is ready, just before it writes
// the message, and answers GateClosed without writing it when the gate
// is shut, so another process that holds the account by then does not
// send it a second time.

type gateKey struct{}

// WithSendGate returns ctx carrying open, the gate Send asks before the
// message leaves.
func WithSendGate(ctx context.Context, open func() bool) context.Context {
	return context.WithValue(ctx, gateKey{}, open)
}

// sendGate returns ctx's gate, nil when it has none.
func sendGate(ctx context.Context) func() bool {
	open, _ := ctx.Value(gateKey{}).(func() bool)
	return open
}

// gateOpen reports whether a message held by gate (nil: none) may go out.
func gateOpen(gate func() bool) bool { return gate == nil || gate() }

// GateClosed is the result of a message not written because its gate was
// shut once the connection was ready: never sent, so safe to send again.
var GateClosed = Result{Class: contract.ClassRetryable, Code: "gate_closed",
	Err: "not sent: the sender may no longer send for the account (its lease was not confirmed once the connection was ready)"}
