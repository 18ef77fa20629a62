// Package embedded runs a nats-server with JetStream inside the process, for
// the dev and demo commands, benchmarks and tests.
package embedded

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// MaxPayload matches nats.conf: large enough for tasks with many inline
// recipients.
const MaxPayload = 8 << 20

// Config tunes the embedded server.
type Config struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free one. Defaults to -1.
	Port int
	// StoreDir holds JetStream data. Required.
	StoreDir string
	// ServerName distinguishes cluster nodes. Defaults to "broadcast".
	ServerName string
	// Logs turns on the server's own log lines.
	Logs bool
	// Options, when set, is used as is (after StoreDir and JetStream are
	// filled); for clusters and auth.
	Options *server.Options
}

// Start runs the server and waits until it accepts connections.
func Start(c Config) (*server.Server, error) {
	opts := c.Options
	if opts == nil {
		opts = &server.Options{}
	}
	if opts.Host == "" {
		opts.Host = c.Host
		if opts.Host == "" {
			opts.Host = "127.0.0.1"
		}
	}
	if opts.Port == 0 {
		opts.Port = c.Port
		if opts.Port == 0 {
			opts.Port = -1
		}
	}
	if opts.ServerName == "" {
		opts.ServerName = c.ServerName
		if opts.ServerName == "" {
			opts.ServerName = "broadcast"
		}
	}
	if c.StoreDir == "" && opts.StoreDir == "" {
		return nil, fmt.Errorf("embedded: StoreDir is required")
	}
	if opts.StoreDir == "" {
		opts.StoreDir = c.StoreDir
	}
	opts.JetStream = true
	opts.NoSigs = true
	if opts.MaxPayload == 0 {
		opts.MaxPayload = MaxPayload
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if c.Logs {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded: server not ready after 15s")
	}
	return s, nil
}
