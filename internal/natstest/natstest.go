// Package natstest starts embedded nats-servers for tests: one per test, on a
// random loopback port with its store in t.TempDir().
package natstest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// Server is a running test server and a client connected to it with the
// topology in place.
type Server struct {
	*server.Server
	URL string
	NC  *nats.Conn
	JS  jetstream.JetStream
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

// Start runs a JetStream server for the test and ensures the topology.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := embedded.Start(embedded.Config{StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	ts := &Server{Server: s, URL: s.ClientURL(), Dir: dir}
	ts.connect(t)
	return ts
}

func (ts *Server) connect(t testing.TB) {
	ts.connectWith(t, &shared.TopologyConfig{})
}

// connectWith connects NC and JS with ts.Creds and, when topo is not nil,
// ensures the topology.
func (ts *Server) connectWith(t testing.TB, topo *shared.TopologyConfig) {
	nc, js := ts.ConnectAs(t, ts.Creds)
	ts.NC, ts.JS = nc, js
	if topo != nil {
		EnsureTopology(t, js, *topo)
	}
}

// EnsureTopology creates every stream and bucket, retrying for up to 30 s
// while a fresh cluster is still electing leaders.
func EnsureTopology(t testing.TB, js jetstream.JetStream, topo shared.TopologyConfig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		if err = shared.EnsureTopology(ctx, js, topo); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err, "ensure topology")
}

// NATSConfig is the config a service under test connects with.
func (ts *Server) NATSConfig() shared.NATSConfig {
	return shared.NATSConfig{URL: ts.URL, User: ts.Creds.User, Password: ts.Creds.Password}
}

// Eventually polls cond every 20ms until it returns true or timeout passes.
// msg is printed with the last state on failure.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, timeout, 20*time.Millisecond, msgAndArgs...)
}

// PutAccount stores an account JSON in KV broadcast_accounts.
func (ts *Server) PutAccount(t testing.TB, name, account string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, shared.BucketAccounts)
	require.NoError(t, err)
	_, err = kv.Put(ctx, name, []byte(account))
	require.NoError(t, err)
}

// Progress reads a task's progress, or nil when there is none yet.
func (ts *Server) Progress(t testing.TB, taskID string) *shared.Progress {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, shared.BucketProgress)
	require.NoError(t, err)
	e, err := kv.Get(ctx, taskID)
	if err != nil {
		return nil
	}
	var p shared.Progress
	require.NoError(t, json.Unmarshal(e.Value(), &p))
	return &p
}

// WaitFinal polls a task's progress until it is final and returns it.
func (ts *Server) WaitFinal(t testing.TB, taskID string, timeout time.Duration) *shared.Progress {
	t.Helper()
	var p *shared.Progress
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p = ts.Progress(t, taskID); p != nil && p.State.Final() {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.FailNowf(t, "task not final", "task %s not final after %s; last progress: %+v", taskID, timeout, p)
	return nil
}

// Events returns every event of a task stored in EVENTS, in stream order.
func (ts *Server) Events(t testing.TB, taskID string) []shared.Event {
	t.Helper()
	return ts.events(t, shared.SubjectEventsPrefix+taskID+".>")
}

// AllEvents returns every event in EVENTS, in stream order.
func (ts *Server) AllEvents(t testing.TB) []shared.Event {
	t.Helper()
	return ts.events(t, shared.SubjectEventsPrefix+">")
}

func (ts *Server) events(t testing.TB, filter string) []shared.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ts.JS.OrderedConsumer(ctx, shared.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
	})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []shared.Event
	pending := info.NumPending
	for uint64(len(out)) < pending {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			var ev shared.Event
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			out = append(out, ev)
		}
		require.NoError(t, batch.Error())
	}
	return out
}
