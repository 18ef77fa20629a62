package shared

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultNATSURL is used when NATS_URL is unset.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSConfig says how to reach the server.
type NATSConfig struct {
	// URL of the server(s), comma separated. Defaults to nats://127.0.0.1:4222.
	URL string
	// User and Password authenticate with a user from nats.conf.
	User, Password string
	// Creds is a credentials file (production). Takes precedence over User.
	Creds string
	// CA is a PEM file of the certificate authority that signed the
	// server's certificate; setting it (or Cert) turns on TLS, as does a
	// tls:// URL. Defaults to none: the system roots when TLS is on.
	CA string
	// Cert and Key are the client's PEM certificate and key, for servers
	// that verify clients (tls { verify: true }). Defaults to none.
	Cert, Key string
	// InProcess, when set, connects to a server in this process without a
	// socket (the embedded server of the dev, demo and bench modes).
	InProcess nats.InProcessConnProvider
}

// NATSConfigFromEnv reads NATS_URL, NATS_USER, NATS_PASSWORD, NATS_CREDS and,
// for TLS, NATS_CA, NATS_CERT and NATS_KEY.
func NATSConfigFromEnv() NATSConfig {
	c := NATSConfig{
		URL:      os.Getenv("NATS_URL"),
		User:     os.Getenv("NATS_USER"),
		Password: os.Getenv("NATS_PASSWORD"),
		Creds:    os.Getenv("NATS_CREDS"),
		CA:       os.Getenv("NATS_CA"),
		Cert:     os.Getenv("NATS_CERT"),
		Key:      os.Getenv("NATS_KEY"),
	}
	if c.URL == "" {
		c.URL = DefaultNATSURL
	}
	return c
}

// Connect dials NATS with reconnects that never give up, so a service
// outlives a server restart. name identifies the client in server logs.
func Connect(c NATSConfig, name string, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("broadcast-" + name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("NATS async error", "err", err, KeySubject, subj)
		}),
	}
	switch {
	case c.Creds != "":
		opts = append(opts, nats.UserCredentials(c.Creds))
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.CA != "" {
		opts = append(opts, nats.RootCAs(c.CA))
	}
	if c.Cert != "" || c.Key != "" {
		if c.Cert == "" || c.Key == "" {
			return nil, fmt.Errorf("NATS_CERT and NATS_KEY: set both or neither")
		}
		opts = append(opts, nats.ClientCert(c.Cert, c.Key))
	}
	if c.InProcess != nil {
		opts = append(opts, nats.InProcessServer(c.InProcess))
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.URL, err)
	}
	return nc, nil
}

// WaitConnected blocks until nc is connected or ctx ends; with
// RetryOnFailedConnect a client may start before the server does.
func WaitConnected(ctx context.Context, nc *nats.Conn) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for NATS: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// ConnectJetStream connects, waits for the server and returns the
// connection with its JetStream context.
func ConnectJetStream(ctx context.Context, c NATSConfig, name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := Connect(c, name, log)
	if err != nil {
		return nil, nil, err
	}
	if err := WaitConnected(ctx, nc); err != nil {
		nc.Close()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// ConnectService is what every service does first: connect, wait for the
// server and then for the topology that `broadcast setup` creates
// (WaitForTopology, at most TopologyWait). It creates nothing.
func ConnectService(ctx context.Context, c NATSConfig, name string, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, js, err := ConnectJetStream(ctx, c, name, log)
	if err != nil {
		return nil, nil, err
	}
	if err := WaitForTopology(ctx, js, TopologyWait, log); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
