package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// startEmbedded runs a nats-server in this process and connects to it with
// the topology in place.
func startEmbedded(ctx context.Context, cfg embedded.Config, log *slog.Logger) (*server.Server, *nats.Conn, jetstream.JetStream, error) {
	s, err := embedded.Start(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, js, err := shared.Setup(ctx, shared.NATSConfig{URL: s.ClientURL(), InProcess: s}, "embedded", shared.TopologyConfig{}, log)
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
