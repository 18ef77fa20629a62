package status

import (
	"fmt"
	"log/slog"
	"os"
	"time"
)

// Config tunes the status service.
type Config struct {
	// FlushInterval is how often progress is written to KV while events
	// arrive. Defaults to 500ms.
	FlushInterval time.Duration
	// MaxUnflushed forces a flush after this many events. Defaults to 20000.
	MaxUnflushed int
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// ConfigFromEnv reads STATUS_FLUSH_INTERVAL (a Go duration).
func ConfigFromEnv() (Config, error) {
	var c Config
	if v := os.Getenv("STATUS_FLUSH_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, fmt.Errorf("STATUS_FLUSH_INTERVAL: %q is not a duration like 500ms", v)
		}
		c.FlushInterval = d
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.FlushInterval < 0 || c.FlushInterval > time.Second {
		return fmt.Errorf("FlushInterval: must be between 1ms and 1s (progress must update at least once a second), got %s", c.FlushInterval)
	}
	if c.MaxUnflushed < 0 {
		return fmt.Errorf("MaxUnflushed: must be positive")
	}
	return nil
}

func (c *Config) withDefaults() {
	if c.FlushInterval == 0 {
		c.FlushInterval = 500 * time.Millisecond
	}
	if c.MaxUnflushed == 0 {
		c.MaxUnflushed = 20000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
