// Package natstest starts embedded nats-servers for tests: one per test, on a
// random loopback port with its store in t.TempDir().
package natstest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
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
	return StartWithTopology(t, shared.TopologyConfig{})
}

// StartWithTopology is Start with the topology built from topo (a short
// Retention, say).
func StartWithTopology(t testing.TB, topo shared.TopologyConfig) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := embedded.Start(embedded.Config{StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	ts := &Server{Server: s, URL: s.ClientURL(), Dir: dir}
	ts.connectWith(t, &topo)
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
	kv, err := ts.JS.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = kv.Put(ctx, name, []byte(account))
	require.NoError(t, err)
}

// Progress reads a task's progress, or nil when there is none yet or it
// could not be read (logged): callers poll it, and a cluster electing the
// bucket's leader answers no for a moment.
func (ts *Server) Progress(t testing.TB, taskID string) *contract.Progress {
	t.Helper()
	p, err := ts.progress(taskID)
	if err != nil {
		t.Logf("progress of %s not read: %v", taskID, err)
	}
	return p
}

// progress reads a task's progress: nil and no error when there is none
// yet, an error when the bucket could not be reached.
func (ts *Server) progress(taskID string) (*contract.Progress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", contract.BucketProgress, err)
	}
	e, err := kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", taskID, err)
	}
	var p contract.Progress
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return nil, fmt.Errorf("progress of %s: %w", taskID, err)
	}
	return &p, nil
}

// WaitFinal polls a task's progress until it is final and returns it. A
// read that fails (a cluster electing a new leader for the bucket) is
// tried again until the timeout, like a user polling `nats kv get`.
func (ts *Server) WaitFinal(t testing.TB, taskID string, timeout time.Duration) *contract.Progress {
	t.Helper()
	var (
		p       *contract.Progress
		lastErr error
	)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got, err := ts.progress(taskID)
		if err != nil {
			lastErr = err
		} else if p = got; p != nil && p.State.Final() {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.FailNowf(t, "task not final", "task %s not final after %s; last progress: %+v; last read error: %v", taskID, timeout, p, lastErr)
	return nil
}

// Events returns every event of a task stored in EVENTS, in stream order.
func (ts *Server) Events(t testing.TB, taskID string) []contract.Event {
	t.Helper()
	return ts.events(t, contract.SubjectEventsPrefix+taskID+".>")
}

// AllEvents returns every event in EVENTS, in stream order.
func (ts *Server) AllEvents(t testing.TB) []contract.Event {
	t.Helper()
	return ts.events(t, contract.SubjectEventsPrefix+">")
}

func (ts *Server) events(t testing.TB, filter string) []contract.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ts.JS.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
	})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []contract.Event
	pending := info.NumPending
	for uint64(len(out)) < pending {
		// Ask for no more than are pending: a fetch of more waits out its
		// whole MaxWait.
		batch, err := c.Fetch(int(min(500, pending-uint64(len(out)))), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			var ev contract.Event
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			out = append(out, ev)
		}
		require.NoError(t, batch.Error())
	}
	return out
}
