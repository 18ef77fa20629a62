package feedback

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
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
	// WxPusherRate is how many status queries per second the WxPusher
	// poller makes per app (per appToken: accounts sharing one share the
	// budget), with bursts of one (FEEDBACK_WXPUSHER_RATE). WxPusher allows
	// about 2 calls per second per app, sends included. Defaults to 1.
	WxPusherRate float64
	// WxPusherFirstPoll is how long after a WxPusher send its status is
	// first queried; later queries come when the send's age has doubled,
	// up to WxPusherMaxPollDelay apart. Defaults to 30 seconds.
	WxPusherFirstPoll time.Duration
	// WxPusherMaxPollDelay caps the delay between queries of one send.
	// Defaults to 30 minutes.
	WxPusherMaxPollDelay time.Duration
	// WxPusherPollFor is how long a send is polled before it is given up
	// (WxPusher keeps statuses about 7 days). Defaults to 7 days.
	WxPusherPollFor time.Duration
	// WxPusherMaxPending bounds the WxPusher sends awaiting a final status
	// (the poller consumer's MaxAckPending); beyond it newer sends wait in
	// EVENTS until older ones end. Defaults to 10,000.
	WxPusherMaxPending int
	// StopKeywords are the inbound WhatsApp text replies (trimmed, any
	// letter case) that add their sender to the suppression list with
	// reason opt_out (FEEDBACK_STOP_KEYWORDS, comma-separated; "none"
	// turns them off). Defaults to DefaultStopKeywords: STOP, UNSUBSCRIBE,
	// 退订, TD.
	StopKeywords []string
	// stopKeywordsOff is set by FEEDBACK_STOP_KEYWORDS=none.
	stopKeywordsOff bool
	// Metrics is the registry the service's metrics join. Defaults to nil
	// (no metrics).
	Metrics *prometheus.Registry
	// Logger defaults to discarding.
	Logger *slog.Logger

	metrics *metrics.Feedback
}

// ConfigFromEnv reads FEEDBACK_ADDR, FEEDBACK_TOKEN, FEEDBACK_SECRET_ENVS
// (or DISPATCH_SECRET_ENVS), FEEDBACK_STOP_KEYWORDS, FEEDBACK_MATCH_WAIT
// and FEEDBACK_WXPUSHER_RATE.
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
	if v := strings.TrimSpace(os.Getenv("FEEDBACK_STOP_KEYWORDS")); strings.EqualFold(v, "none") {
		c.stopKeywordsOff = true
	} else {
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k != "" {
				c.StopKeywords = append(c.StopKeywords, k)
			}
		}
	}
	if v := os.Getenv("FEEDBACK_MATCH_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, fmt.Errorf("FEEDBACK_MATCH_WAIT: %q is not a duration (e.g. 2m)", v)
		}
		c.MatchWait = d
	}
	if v := os.Getenv("FEEDBACK_WXPUSHER_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 || r > 100 {
			return c, fmt.Errorf("FEEDBACK_WXPUSHER_RATE: %q is not a rate in calls per second (e.g. 1)", v)
		}
		c.WxPusherRate = r
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
	case c.WxPusherRate < 0 || c.WxPusherRate > 100 || math.IsNaN(c.WxPusherRate):
		return fmt.Errorf("WxPusherRate: must be between 0 and 100 calls per second, got %g", c.WxPusherRate)
	case c.WxPusherFirstPoll < 0 || c.WxPusherMaxPollDelay < 0 || c.WxPusherPollFor < 0:
		return errors.New("WxPusherFirstPoll, WxPusherMaxPollDelay, WxPusherPollFor: must not be negative")
	case c.WxPusherMaxPending < 0 || c.WxPusherMaxPending > 1_000_000:
		return fmt.Errorf("WxPusherMaxPending: must be between 1 and 1000000, got %d", c.WxPusherMaxPending)
	case len(c.StopKeywords) > 100:
		return fmt.Errorf("StopKeywords: at most 100, got %d", len(c.StopKeywords))
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
	if c.WxPusherRate == 0 {
		c.WxPusherRate = 1
	}
	if c.WxPusherFirstPoll == 0 {
		c.WxPusherFirstPoll = 30 * time.Second
	}
	if c.WxPusherMaxPollDelay == 0 {
		c.WxPusherMaxPollDelay = 30 * time.Minute
	}
	if c.WxPusherPollFor == 0 {
		c.WxPusherPollFor = 7 * 24 * time.Hour
	}
	if c.WxPusherMaxPending == 0 {
		c.WxPusherMaxPending = 10_000
	}
	if c.StopKeywords == nil && !c.stopKeywordsOff {
		c.StopKeywords = DefaultStopKeywords
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.metrics = metrics.NewFeedback(c.Metrics)
}
