package feedback

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
)

// DefaultAddr is where feedback listens unless FEEDBACK_ADDR says otherwise.
const DefaultAddr = "127.0.0.1:8090"

// Config tunes the feedback service.
type Config struct {
	// Addr is the HTTP address of the webhook routes (FEEDBACK_ADDR).
	// Defaults to 127.0.0.1:8090; "127.0.0.1:0" picks a free port (Addr
	// on the Service then tells which).
	Addr string
	// Token is the bearer token POST /webhooks/bounce requires
	// (FEEDBACK_TOKEN). Defaults to none: the route then refuses every
	// request.
	Token string
	// SecretEnvs lists the environment variables an account's secret_env,
	// app_secret_env or verify_token_env may name besides
	// BROADCAST_SECRET_* (FEEDBACK_SECRET_ENVS, else DISPATCH_SECRET_ENVS,
	// comma-separated). Reserved names are never allowed. Defaults to none.
	SecretEnvs []string
	// Getenv reads the secrets accounts name. Defaults to os.Getenv.
	Getenv func(string) string
	// MaxBody is the largest request body accepted; larger ones get 413.
	// Defaults to 1 MiB.
	MaxBody int64
	// MaxInFlight bounds the requests handled at once (each may hold up to
	// MaxBody in memory); beyond it a request gets 503 at once and the
	// provider retries. Defaults to 256.
	MaxInFlight int
	// StoreTimeout bounds how long a request waits for the server to store
	// its receipts before it answers 503 (the provider retries). Defaults
	// to 5 seconds.
	StoreTimeout time.Duration
	// MatchWait is how long a receipt whose provider id is not indexed yet
	// (it raced ahead of its sent event) is retried before it is counted
	// unmatched (FEEDBACK_MATCH_WAIT). A receipt is never given up while
	// the index is behind the sent events. Defaults to 2 minutes.
	MatchWait time.Duration
	// MatchRetry is the first delay before an unmatched receipt is tried
	// again; it doubles up to 30 seconds. Defaults to 500 ms.
	MatchRetry time.Duration
	// Concurrency is how many receipts, and how many sent events, are
	// handled at once. Defaults to 64.
	Concurrency int
	// Metrics is the registry the service's metrics join. Defaults to nil
	// (no metrics).
	Metrics *prometheus.Registry
	// Logger defaults to discarding.
	Logger *slog.Logger

	metrics *metrics.Feedback
}

// ConfigFromEnv reads FEEDBACK_ADDR, FEEDBACK_TOKEN, FEEDBACK_SECRET_ENVS
// (or DISPATCH_SECRET_ENVS) and FEEDBACK_MATCH_WAIT.
func ConfigFromEnv() (Config, error) {
	c := Config{Addr: os.Getenv("FEEDBACK_ADDR"), Token: os.Getenv("FEEDBACK_TOKEN")}
	envs := os.Getenv("FEEDBACK_SECRET_ENVS")
	if envs == "" {
		envs = os.Getenv("DISPATCH_SECRET_ENVS")
	}
	for _, n := range strings.Split(envs, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.SecretEnvs = append(c.SecretEnvs, n)
		}
	}
	if v := os.Getenv("FEEDBACK_MATCH_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, fmt.Errorf("FEEDBACK_MATCH_WAIT: %q is not a duration (e.g. 2m)", v)
		}
		c.MatchWait = d
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if err := contract.CheckSecretEnvAllowList(c.SecretEnvs); err != nil {
		return fmt.Errorf("SecretEnvs: %w", err)
	}
	switch {
	case c.MaxBody < 0:
		return fmt.Errorf("MaxBody: must not be negative, got %d", c.MaxBody)
	case c.StoreTimeout < 0:
		return fmt.Errorf("StoreTimeout: must not be negative, got %s", c.StoreTimeout)
	case c.MatchWait < 0:
		return fmt.Errorf("MatchWait: must not be negative, got %s", c.MatchWait)
	case c.MatchRetry < 0:
		return fmt.Errorf("MatchRetry: must not be negative, got %s", c.MatchRetry)
	case c.MaxInFlight < 0:
		return fmt.Errorf("MaxInFlight: must not be negative, got %d", c.MaxInFlight)
	case c.Concurrency < 0 || c.Concurrency > 10_000:
		return fmt.Errorf("Concurrency: must be between 1 and 10000, got %d", c.Concurrency)
	}
	return nil
}

func (c *Config) withDefaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.MaxBody == 0 {
		c.MaxBody = 1 << 20
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 5 * time.Second
	}
	if c.MatchWait == 0 {
		c.MatchWait = 2 * time.Minute
	}
	if c.MatchRetry == 0 {
		c.MatchRetry = 500 * time.Millisecond
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.metrics = metrics.NewFeedback(c.Metrics)
}
