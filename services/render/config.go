package render

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// Config tunes the render service.
type Config struct {
	// Concurrency is how many batches are rendered at once. Defaults to 4.
	Concurrency int
	// RecipientsInFlight bounds the recipients of the batches rendered at
	// once: a batch takes as many as it holds (all of them when it holds
	// more), so the large batches of a task over many accounts render one
	// at a time and each reaches dispatch as soon as it can, instead of
	// all together at the end of their shared time. Defaults to 500 (ingest's
	// default batch) per Concurrency.
	RecipientsInFlight int
	// AccountSlack is how far, in percent, an account may go over its
	// share of a batch before the batch's next recipients whose usual
	// account it is go to their next one (shared.Balancer). 0 (the
	// default) spreads each batch evenly, so the busiest account, which
	// sets a paced task's time, holds its share; 10 keeps more recipients
	// on their usual account (1 in 16 moved instead of 1 in 7 over 1,000
	// accounts) for up to 13 % more time over many accounts.
	AccountSlack int
	// JobsPerMessage is how many jobs of one account a job message
	// carries at most (grouping.go); 1 publishes each job alone. Defaults
	// to DefaultJobsPerMessage.
	JobsPerMessage int
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

// maxJobsPerMessage bounds JobsPerMessage: a message's jobs are
// acknowledged together, so a larger group holds its first jobs' slot
// longer for nothing more saved.
const maxJobsPerMessage = 256

// DefaultJobsPerMessage is Config.JobsPerMessage's default
// (contract.DefaultJobGroupSize): at 16 or more the stream's work per job
// is small beside the rest per recipient, its sent event
// (docs/performance.md).
const DefaultJobsPerMessage = contract.DefaultJobGroupSize

// ConfigFromEnv reads RENDER_CONCURRENCY, RENDER_JOBS_PER_MESSAGE,
// RENDER_RECIPIENTS_IN_FLIGHT and RENDER_ACCOUNT_SLACK.
func ConfigFromEnv() (Config, error) {
	var c Config
	for name, dst := range map[string]*int{"RENDER_CONCURRENCY": &c.Concurrency, "RENDER_JOBS_PER_MESSAGE": &c.JobsPerMessage,
		"RENDER_RECIPIENTS_IN_FLIGHT": &c.RecipientsInFlight, "RENDER_ACCOUNT_SLACK": &c.AccountSlack} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return c, fmt.Errorf("%s: %q is not a whole number", name, v)
			}
			*dst = n
		}
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.Concurrency < 0 || c.Concurrency > 256 {
		return fmt.Errorf("Concurrency: must be between 1 and 256, got %d", c.Concurrency)
	}
	if c.JobsPerMessage < 0 || c.JobsPerMessage > maxJobsPerMessage {
		return fmt.Errorf("JobsPerMessage: must be between 1 and %d, got %d", maxJobsPerMessage, c.JobsPerMessage)
	}
	if c.RecipientsInFlight < 0 {
		return fmt.Errorf("RecipientsInFlight: must not be negative, got %d", c.RecipientsInFlight)
	}
	if c.AccountSlack < 0 || c.AccountSlack > 100 {
		return fmt.Errorf("AccountSlack: must be between 0 and 100 (percent), got %d", c.AccountSlack)
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
	if c.RecipientsInFlight == 0 {
		c.RecipientsInFlight = 500 * c.Concurrency
	}
	if c.JobsPerMessage == 0 {
		c.JobsPerMessage = DefaultJobsPerMessage
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
