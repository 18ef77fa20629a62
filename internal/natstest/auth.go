package natstest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// ConfigServer is a test server run from a nats-server configuration file,
// with its log lines kept so a test can read the permission violations.
type ConfigServer struct {
	*Server
	// Log holds the server's error and warning lines.
	Log *ServerLog
}

// ConfigOptions tunes StartConfigFile.
type ConfigOptions struct {
	// EnsureAs is the user that creates the topology (auth.conf's admin:
	// no other user may). Required.
	EnsureAs Credentials
	// ClientAs is the user the Server's own client (NC, JS) connects as.
	// Defaults to EnsureAs.
	ClientAs Credentials
	// TLS, when set, is the server's TLS configuration, and ClientTLS what
	// the test's own client dials with.
	TLS, ClientTLS *tls.Config
}

// StartConfigFile runs a server from the configuration file at path (for
// example the repository's nats.conf) with its users and permissions, but
// on a free loopback port, without the monitoring port, and with its store
// in t.TempDir().
func StartConfigFile(t testing.TB, path string, o ConfigOptions) *ConfigServer {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, "parse %s", path)
	dir := t.TempDir()
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = dir
	if o.TLS != nil {
		opts.TLSConfig, opts.TLS, opts.TLSVerify = o.TLS, true, o.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	}
	log := &ServerLog{}
	s, err := embedded.Start(embedded.Config{Options: opts, StoreDir: dir})
	require.NoError(t, err)
	s.SetLogger(log, false, false)
	t.Cleanup(s.Shutdown)
	url := s.ClientURL()
	if o.TLS != nil {
		url = strings.Replace(url, "nats://", "tls://", 1)
	}
	ts := &Server{Server: s, URL: url, Dir: dir, Creds: o.EnsureAs, tls: o.ClientTLS}
	// The topology is created by EnsureAs, then the client reconnects as
	// ClientAs (which may be the operator, who cannot create streams).
	nc, js := ts.ConnectAs(t, o.EnsureAs)
	EnsureTopology(t, js, shared.TopologyConfig{})
	nc.Close()
	if o.ClientAs.User != "" {
		ts.Creds = o.ClientAs
	}
	ts.connectWith(t, nil)
	return &ConfigServer{Server: ts, Log: log}
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

// ServerLog collects a server's log lines; it implements server.Logger.
type ServerLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ServerLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
}

// Noticef implements server.Logger (notices are not kept).
func (l *ServerLog) Noticef(string, ...any) {}

// Warnf implements server.Logger.
func (l *ServerLog) Warnf(format string, v ...any) { l.add("[WRN]", format, v...) }

// Fatalf implements server.Logger.
func (l *ServerLog) Fatalf(format string, v ...any) { l.add("[FTL]", format, v...) }

// Errorf implements server.Logger.
func (l *ServerLog) Errorf(format string, v ...any) { l.add("[ERR]", format, v...) }

// Debugf implements server.Logger (debug lines are not kept).
func (l *ServerLog) Debugf(string, ...any) {}

// Tracef implements server.Logger (trace lines are not kept).
func (l *ServerLog) Tracef(string, ...any) {}

// Violations returns the permission and authorization violations logged so
// far, e.g. `[ERR] 127.0.0.1:5555 - cid:9 - "v1.55.0:go:broadcast-ingest" - "ingest" - Publish Violation - Subject "broadcast.jobs.x"`.
func (l *ServerLog) Violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, "Violation") {
			out = append(out, line)
		}
	}
	return out
}

// Lines returns every kept line.
func (l *ServerLog) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// DialTLS connects to ts as creds with clientTLS instead of the Server's own
// client TLS configuration (nil: plain text), without retrying: for tests of
// what the server refuses.
func DialTLS(ts *Server, creds Credentials, clientTLS *tls.Config) (*nats.Conn, error) {
	opts := creds.options(nats.MaxReconnects(0), nats.Timeout(20*time.Second))
	url := ts.URL
	if clientTLS != nil {
		opts = append(opts, nats.Secure(clientTLS))
	} else {
		url = strings.Replace(url, "tls://", "nats://", 1)
	}
	return nats.Connect(url, opts...)
}
