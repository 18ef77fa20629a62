package natstest

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
)

// Server is a running test server and the test's own client connected to
// it.
type Server struct {
	*server.Server
	// URL is where clients connect: the server's client URL, or every
	// node's for a cluster.
	URL string
	// NC and JS are the test's client, connected with Creds.
	NC *nats.Conn
	JS jetstream.JetStream
	// Dir is the server's store (a t.TempDir()).
	Dir string
	// Creds are what NC connected with (none for a server without
	// authorization).
	Creds Credentials

	tls *tls.Config // what clients dial with, for a TLS server
}

// Credentials authenticate a client as a user of the server's
// configuration; the zero value connects anonymously.
type Credentials struct{ User, Password string }

// options adds the credentials (when set) to opts.
func (c Credentials) options(opts ...nats.Option) []nats.Option {
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	return opts
}

// Setup prepares a new server before the test uses it, for example by
// creating streams and buckets. It runs on the Server's own client and is
// tried again for up to 30 s while it fails, because a fresh cluster
// answers "no leader" until its nodes have elected one, each try cut off
// after 10 s.
type Setup func(ctx context.Context, js jetstream.JetStream) error

// Start runs a JetStream server for the test, with nothing in it.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with setup run before it returns (nil: none).
func StartWith(t testing.TB, setup Setup) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := embedded.Start(embedded.Config{StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	ts := &Server{Server: s, URL: s.ClientURL(), Dir: dir}
	ts.connect(t, setup)
	return ts
}

// connect connects NC and JS with ts.Creds and runs setup (when not nil)
// on them.
func (ts *Server) connect(t testing.TB, setup Setup) {
	t.Helper()
	ts.NC, ts.JS = ts.ConnectAs(t, ts.Creds)
	runSetup(t, ts.JS, setup)
}

// setupTryTimeout bounds one try of a Setup: a JetStream API request to a
// cluster that has just formed is now and then never answered, and waiting
// for it would use up every try.
const setupTryTimeout = 10 * time.Second

// runSetup runs setup on js, retrying for up to 30 s.
func runSetup(t testing.TB, js jetstream.JetStream, setup Setup) {
	t.Helper()
	if setup == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		tryCtx, cancelTry := context.WithTimeout(ctx, setupTryTimeout)
		err = setup(tryCtx, js)
		cancelTry()
		if err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err, "set up the server")
}

// ConnectAs opens a connection as creds (anonymous when zero) that is
// closed when the test ends. It fails the test when the server refuses it.
func (ts *Server) ConnectAs(t testing.TB, creds Credentials, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := ts.Dial(creds, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// Dial connects as creds without retrying, returning the server's refusal
// (for example an authorization violation) as the error.
func (ts *Server) Dial(creds Credentials, opts ...nats.Option) (*nats.Conn, error) {
	// bcrypt-hashed passwords make each authentication cost ~100 ms, much
	// more under the race detector: allow for it.
	all := creds.options(nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(20*time.Second))
	if ts.tls != nil {
		all = append(all, nats.Secure(ts.tls))
	}
	all = append(all, opts...)
	// A handshake that times out under load (bcrypt on a busy 2-core
	// machine, "expected 'PONG', got 'PING'") is retried; a refusal is not.
	var err error
	for range 3 {
		var nc *nats.Conn
		if nc, err = nats.Connect(ts.URL, all...); err == nil {
			return nc, nil
		}
		if !strings.Contains(err.Error(), "PONG") && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
	}
	return nil, err
}

// DialTLS connects as creds with clientTLS instead of the Server's own
// client TLS configuration (nil: plain text), without retrying: for tests
// of what the server refuses.
func (ts *Server) DialTLS(creds Credentials, clientTLS *tls.Config) (*nats.Conn, error) {
	opts := creds.options(nats.MaxReconnects(0), nats.Timeout(20*time.Second))
	url := ts.URL
	if clientTLS != nil {
		opts = append(opts, nats.Secure(clientTLS))
	} else {
		url = strings.Replace(url, "tls://", "nats://", 1)
	}
	return nats.Connect(url, opts...)
}

// Eventually polls cond every 20ms until it returns true or timeout passes.
// msg is printed with the last state on failure.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, timeout, 20*time.Millisecond, msgAndArgs...)
}

// RunUntilCleanup runs run (a service's Run) in the background until the
// test ends, then cancels its context and waits for it to return.
func RunUntilCleanup(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}
