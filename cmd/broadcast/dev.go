package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"

	"github.com/broadcastd/broadcast/internal/embedded"
)

// devSandboxAccount is created on first start so a task can be sent at once.
const devSandboxAccount = `{"channel":"sandbox","rate_per_sec":50,"burst":10,"concurrency":8,"latency":"20ms"}`

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	port := fs.Int("port", 4222, "port of the embedded nats-server (127.0.0.1)")
	dir := fs.String("data", filepath.Join(".data", "dev"), "JetStream store directory")
	_ = fs.Parse(args)
	log, err := newLogger()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	s, nc, js, err := startEmbedded(ctx, embedded.Config{Port: *port, StoreDir: *dir}, log)
	if err != nil {
		return err
	}
	defer s.Shutdown()
	defer nc.Close()
	if created, err := putAccountIfMissing(ctx, js, "sandbox", devSandboxAccount); err != nil {
		return err
	} else if created {
		log.Info("created account \"sandbox\" (channel sandbox)", "value", devSandboxAccount)
	}
	log.Info("dev stack running; Ctrl-C to stop", "nats_url", s.ClientURL(), "store", *dir)
	return runServices(ctx, js, log, allServices, serviceOverrides{})
}
