package ingest

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/internal/metrics"
)

// Config tunes the ingest service.
type Config struct {
	// BatchSize is how many recipients travel in one render batch, at
	// least: a task over more than BatchSize/16 accounts gets batches of 16
	// recipients per account (up to 16,000), so that render can still put
	// several jobs of an account in a message. Defaults to 500.
	BatchSize int
	// Concurrency is how many tasks are ingested at once. Defaults to 2.
	Concurrency int
	// KeepAliveEvery is how often the records of live tasks (not final:
	// processing, paused, scheduled, awaiting approval) are written again
	// so that the buckets' TTL (TopologyConfig.Retention) never drops them.
	// Defaults to a quarter of the broadcast_tasks bucket's TTL.
	KeepAliveEvery time.Duration
	// Channels knows the channels tasks may name. Defaults to channels.Builtin().
	Channels channels.Registry
	// Metrics is the registry the service's metrics join. Defaults to nil
	// (no metrics).
	Metrics *prometheus.Registry
	// Logger defaults to discarding.
	Logger *slog.Logger

	// metrics is the service's metric set in Metrics, built by withDefaults.
	metrics *metrics.Ingest
}

// DefaultBatchSize is Config.BatchSize when unset.
const DefaultBatchSize = 500

// ConfigFromEnv reads INGEST_BATCH_SIZE and INGEST_CONCURRENCY.
func ConfigFromEnv() (Config, error) {
	var c Config
	var err error
	if c.BatchSize, err = envInt("INGEST_BATCH_SIZE"); err != nil {
		return c, err
	}
	if c.Concurrency, err = envInt("INGEST_CONCURRENCY"); err != nil {
		return c, err
	}
	return c, c.validate()
}

func envInt(name string) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a whole number", name, v)
	}
	return n, nil
}

func (c *Config) validate() error {
	if c.BatchSize < 0 || c.BatchSize > 10_000 {
		return fmt.Errorf("BatchSize: must be between 1 and 10000, got %d", c.BatchSize)
	}
	if c.Concurrency < 0 {
		return fmt.Errorf("Concurrency: must be positive, got %d", c.Concurrency)
	}
	if c.KeepAliveEvery < 0 {
		return fmt.Errorf("KeepAliveEvery: must not be negative, got %s", c.KeepAliveEvery)
	}
	return nil
}

func (c *Config) withDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = 2
	}
	if c.Channels == nil {
		c.Channels = channels.Builtin()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.metrics = metrics.NewIngest(c.Metrics)
}
