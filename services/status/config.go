package status

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// Config tunes the status service.
type Config struct {
	// FlushInterval is how often progress is written to KV while events
	// arrive. Defaults to 500ms.
	FlushInterval time.Duration
	// MaxUnflushed forces a flush after this many events. Defaults to 20000.
	MaxUnflushed int
	// CircuitWindow is how many recent attempts the per-task circuit breaker
	// looks at. Defaults to 200; -1 turns the breaker off.
	CircuitWindow int
	// CircuitThreshold is the failure rate over the window that pauses the
	// task. Defaults to 0.5.
	CircuitThreshold float64
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// ConfigFromEnv reads STATUS_FLUSH_INTERVAL (a Go duration),
// STATUS_CIRCUIT_WINDOW and STATUS_CIRCUIT_THRESHOLD.
func ConfigFromEnv() (Config, error) {
	var c Config
	if v := os.Getenv("STATUS_CIRCUIT_WINDOW"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("STATUS_CIRCUIT_WINDOW: %q is not a whole number", v)
		}
		c.CircuitWindow = n
	}
	if v := os.Getenv("STATUS_CIRCUIT_THRESHOLD"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return c, fmt.Errorf("STATUS_CIRCUIT_THRESHOLD: %q is not a number", v)
		}
		c.CircuitThreshold = f
	}
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
	if c.CircuitThreshold < 0 || c.CircuitThreshold > 1 {
		return fmt.Errorf("CircuitThreshold: must be between 0 and 1, got %v", c.CircuitThreshold)
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
	if c.CircuitWindow == 0 {
		c.CircuitWindow = 200
	}
	if c.CircuitThreshold == 0 {
		c.CircuitThreshold = 0.5
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
