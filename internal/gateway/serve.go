package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// ShutdownGrace is how long Serve waits for requests in flight (a hanging
// timeout fault among them) once its context is cancelled, before closing
// their connections.
const ShutdownGrace = 5 * time.Second

// Serve runs a Gateway for cfg on addr (for example "127.0.0.1:9000") until
// ctx is cancelled, then shuts down gracefully. It returns nil after a clean
// shutdown, a Config error wrapping ErrInvalidConfig, or the listen error.
// log may be nil; the secret is never logged.
func Serve(ctx context.Context, addr string, cfg Config, log *slog.Logger) error {
	g, err := New(cfg)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("gateway: listen on %s: %w", addr, err)
	}
	return g.Serve(ctx, ln, log)
}

// Serve serves g on ln until ctx is cancelled, then stops accepting, waits
// up to ShutdownGrace for requests in flight and closes what remains. It
// closes ln and returns nil after a clean shutdown. log may be nil.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "config", g.cfg)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("gateway: requests still in flight after grace, closing them", "grace", ShutdownGrace)
		err = srv.Close()
	}
	if serveErr := <-errc; !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = serveErr
	}
	if err != nil {
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	log.Info("gateway stopped", "addr", ln.Addr().String())
	return nil
}

// FetchLedger returns the Ledger of the gateway at baseURL (for example
// "http://127.0.0.1:9000"), read from GET <baseURL>/ledger.
func FetchLedger(ctx context.Context, baseURL string) (Ledger, error) {
	var l Ledger
	resp, err := call(ctx, http.MethodGet, baseURL, "/ledger")
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return l, fmt.Errorf("gateway: decode ledger: %w", err)
	}
	return l, nil
}

// ResetLedger clears the ledger of the gateway at baseURL with POST
// <baseURL>/reset.
func ResetLedger(ctx context.Context, baseURL string) error {
	resp, err := call(ctx, http.MethodPost, baseURL, "/reset")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// call sends an empty request to baseURL+path and fails on any non-2xx.
func call(ctx context.Context, method, baseURL, path string) (*http.Response, error) {
	url := strings.TrimRight(baseURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, fmt.Errorf("gateway: %s %s: %w", method, path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("gateway: %s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return resp, nil
}
