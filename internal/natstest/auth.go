package natstest

import (
	"crypto/tls"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
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
	// SetupAs is the user that runs Setup (for Broadcast's topology
	// auth.conf's admin: no other user may create streams). Required with
	// a configuration that has users.
	SetupAs Credentials
	// ClientAs is the user the Server's own client (NC, JS) connects as.
	// Defaults to SetupAs.
	ClientAs Credentials
	// TLS, when set, is the server's TLS configuration, and ClientTLS what
	// the test's own client dials with.
	TLS, ClientTLS *tls.Config
	// Setup, when set, prepares the server before StartConfigFile returns.
	Setup Setup
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
	ts := &Server{Server: s, URL: url, Dir: dir, Creds: o.SetupAs, tls: o.ClientTLS}
	// Setup runs as SetupAs, then the client reconnects as ClientAs (which
	// may be a user that cannot do what Setup does).
	if o.Setup != nil {
		nc, js := ts.ConnectAs(t, o.SetupAs)
		runSetup(t, js, o.Setup)
		nc.Close()
	}
	if o.ClientAs.User != "" {
		ts.Creds = o.ClientAs
	}
	ts.connect(t, nil)
	return &ConfigServer{Server: ts, Log: log}
}
