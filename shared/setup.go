package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SetUp runs one step of a service's start (a consumer made, a bucket
// opened, a watch begun) until it succeeds or ctx ends. A step that fails
// while the server restarts (its request timed out, nobody answered, the
// connection was down) is tried again every setUpRetry, logged once;
// another error is returned at once. Without it a service started a
// moment before a nats-server restart exited (multi-process scenario
// seed 956785183: render's consumer request timed out and render was gone
// for good).
func SetUp(ctx context.Context, log *slog.Logger, what string, step func(context.Context) error) error {
	logged := false
	for {
		err := step(ctx)
		if err == nil || ctx.Err() != nil || !transientSetUpError(err) {
			return err
		}
		if !logged {
			log.Warn("start step failed; trying again while the server is unreachable", "step", what, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(setUpRetry):
		}
	}
}

// Step is one step of a service's start, for SetUpAll: What names it in
// the log and in the error.
type Step struct {
	What string
	Run  func(context.Context) error
}

// SetUpAll runs steps in order, each through SetUp, and returns the first
// error, prefixed with its step's name.
func SetUpAll(ctx context.Context, log *slog.Logger, steps ...Step) error {
	for _, st := range steps {
		if err := SetUp(ctx, log, st.What, st.Run); err != nil {
			return fmt.Errorf("%s: %w", st.What, err)
		}
	}
	return nil
}

// setUpRetry is how long SetUp waits between tries.
const setUpRetry = time.Second

// transientSetUpError reports whether err is one a server restart causes.
func transientSetUpError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
