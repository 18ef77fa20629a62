package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// startEmbedded runs a nats-server in this process, connects to it and
// creates the topology, as `broadcast setup` does for a real server.
func startEmbedded(ctx context.Context, cfg embedded.Config, log *slog.Logger) (*server.Server, *nats.Conn, jetstream.JetStream, error) {
	s, err := embedded.Start(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, js, err := shared.ConnectJetStream(ctx, shared.NATSConfig{URL: s.ClientURL(), InProcess: s}, "embedded", log)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = setupTopology(sctx, nc, js, shared.TopologyConfig{})
		cancel()
		if err != nil {
			nc.Close()
		}
	}
	if err != nil {
		s.Shutdown()
		return nil, nil, nil, fmt.Errorf("embedded server: %w", err)
	}
	return s, nc, js, nil
}

// putAccount stores an account in KV unless one with that name exists.
func putAccountIfMissing(ctx context.Context, js jetstream.JetStream, name string, account string) (bool, error) {
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	if err != nil {
		return false, err
	}
	if _, err := kv.Create(ctx, name, []byte(account)); err != nil {
		if err == jetstream.ErrKeyExists {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
