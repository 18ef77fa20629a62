package render

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// Config tunes the render service.
type Config struct {
	// Concurrency is how many batches are rendered at once. Defaults to 4.
	Concurrency int
	// NoAccountRetry is how long a batch waits when its task has no enabled
	// account. Defaults to 5 seconds.
	NoAccountRetry time.Duration
	// Channels defaults to channels.Builtin().
	Channels channels.Registry
	// Metrics is the registry the service's metrics join. Defaults to nil
	// (no metrics).
	Metrics *prometheus.Registry
	// Suppressions, when set, gives the suppression list's view shared
	// with the process's other services; nil: the service loads its own.
	Suppressions *suppress.Shared
	// Logger defaults to discarding.
	Logger *slog.Logger

	// metrics is the service's metric set in Metrics, built by withDefaults.
	metrics *metrics.Render
}

// ConfigFromEnv reads RENDER_CONCURRENCY.
func ConfigFromEnv() (Config, error) {
	var c Config
	if v := os.Getenv("RENDER_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("RENDER_CONCURRENCY: %q is not a whole number", v)
		}
		c.Concurrency = n
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.Concurrency < 0 || c.Concurrency > 256 {
		return fmt.Errorf("Concurrency: must be between 1 and 256, got %d", c.Concurrency)
	}
	if c.NoAccountRetry < 0 {
		return fmt.Errorf("NoAccountRetry: must not be negative")
	}
	return nil
}

func (c *Config) withDefaults() {
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.NoAccountRetry == 0 {
		c.NoAccountRetry = 5 * time.Second
	}
	if c.Channels == nil {
		c.Channels = channels.Builtin()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.metrics = metrics.NewRender(c.Metrics)
}
