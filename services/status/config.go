package status

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/internal/metrics"
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
	// DashboardAddr is where the live dashboard, its JSON API and /metrics
	// are served, e.g. "127.0.0.1:8080"; port 0 picks a free port (see
	// Service.DashboardURL). Defaults to "" (no dashboard); ConfigFromEnv
	// reads DASHBOARD_ADDR, defaulting to 127.0.0.1:8080, "off" for none.
	DashboardAddr string
	// DashboardToken, when set, is required of every dashboard request but
	// /healthz: "Authorization: Bearer <token>", or the cookie that opening
	// /?token=<token> sets. A dashboard listening beyond loopback must have
	// one. ConfigFromEnv reads DASHBOARD_TOKEN. Defaults to "" (none).
	DashboardToken string
	// DashboardViewerToken, when set (with DashboardToken), is a second
	// token that sees progress, accounts and charts but no recipient
	// (dead letters, events, failures, lookups) and presses no button.
	// ConfigFromEnv reads DASHBOARD_VIEWER_TOKEN. Defaults to "" (none).
	DashboardViewerToken string
	// DashboardHosts are Host names the dashboard answers besides the
	// loopback names with its port (a name behind a proxy, say); requests
	// naming any other host are refused, so a DNS-rebinding page gets
	// nothing. ConfigFromEnv reads DASHBOARD_HOSTS, comma-separated.
	// Defaults to none.
	DashboardHosts []string
	// Retention is how long a finished task's progress and checkpoint are
	// kept; then they are removed. ConfigFromEnv reads STATUS_RETENTION (a
	// Go duration). Defaults to 720h (30 days, the events' retention).
	Retention time.Duration
	// MaxEventStreams bounds the dashboard's event-stream clients at once.
	// Defaults to 64.
	MaxEventStreams int
	// PollInterval is how often queue depths (JOBS consumer info) and task
	// counts are polled for the dashboard and metrics. Defaults to 3 seconds.
	PollInterval time.Duration
	// AlertURL is the operator webhook called (JSON {"text":...}) when a
	// task ends partial or failed, the circuit breaker pauses a task, an
	// account is paused, or a task's dead letters reach
	// AlertDeadThreshold; only by the process that folds. ConfigFromEnv
	// reads ALERT_URL. Defaults to "" (no alerts).
	AlertURL string
	// AlertInterval is the least time between two alerts of one subject
	// (a task's end, its breaker, its dead letters, an account's pause).
	// ConfigFromEnv reads ALERT_INTERVAL. Defaults to 10 minutes.
	AlertInterval time.Duration
	// AlertDeadThreshold is how many dead letters (failed recipients) of
	// one task make an alert. ConfigFromEnv reads ALERT_DEAD_THRESHOLD.
	// Defaults to 100.
	AlertDeadThreshold int
	// Partitions is how many partitions the fold of the tasks is split
	// into (partition.go): each folded by one status process, the
	// partitions spread evenly over the processes running. Every status
	// process must have the same. ConfigFromEnv reads STATUS_PARTITIONS.
	// Defaults to 1 (one process folds every task).
	Partitions int
	// LayoutSweep is how long after taking partition 0, and how often
	// then, its holder removes another partition count's fold consumers
	// that no process folds (layouts.go). The wait leaves the partitions
	// of a new count time to make their consumers again first. Defaults
	// to 10 minutes.
	LayoutSweep time.Duration
	// SeriesLimit is how many task series, and as many account series, the
	// dashboard's charts keep in memory (series.go, 262 KB each); a new
	// one beyond it evicts the ended task, else the series, idle longest.
	// Defaults to 64.
	SeriesLimit int
	// Metrics is the registry the service's metrics join; the dashboard
	// serves it at /metrics. Defaults to nil (no metrics).
	Metrics *prometheus.Registry
	// Logger defaults to discarding.
	Logger *slog.Logger

	// metrics is the service's metric set in Metrics, built by withDefaults.
	metrics *metrics.Status
}

// DefaultDashboardAddr is the dashboard address ConfigFromEnv uses when
// DASHBOARD_ADDR is unset.
const DefaultDashboardAddr = "127.0.0.1:8080"

// ConfigFromEnv reads STATUS_FLUSH_INTERVAL (a Go duration),
// STATUS_CIRCUIT_WINDOW, STATUS_CIRCUIT_THRESHOLD, DASHBOARD_ADDR
// (host:port, default 127.0.0.1:8080, "off" for no dashboard),
// DASHBOARD_TOKEN, DASHBOARD_HOSTS, STATUS_PARTITIONS and the others named
// on the fields.
func ConfigFromEnv() (Config, error) {
	var c Config
	switch v := os.Getenv("DASHBOARD_ADDR"); v {
	case "":
		c.DashboardAddr = DefaultDashboardAddr
	case "off":
	default:
		c.DashboardAddr = v
	}
	c.DashboardToken = os.Getenv("DASHBOARD_TOKEN")
	c.DashboardViewerToken = os.Getenv("DASHBOARD_VIEWER_TOKEN")
	if v := os.Getenv("DASHBOARD_HOSTS"); v != "" {
		c.DashboardHosts = strings.Split(v, ",")
	}
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
	if v := os.Getenv("STATUS_RETENTION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("STATUS_RETENTION: %q is not a positive duration like 720h", v)
		}
		c.Retention = d
	}
	c.AlertURL = os.Getenv("ALERT_URL")
	if v := os.Getenv("ALERT_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("ALERT_INTERVAL: %q is not a positive duration like 10m", v)
		}
		c.AlertInterval = d
	}
	if v := os.Getenv("ALERT_DEAD_THRESHOLD"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("ALERT_DEAD_THRESHOLD: %q is not a positive whole number", v)
		}
		c.AlertDeadThreshold = n
	}
	if v := os.Getenv("STATUS_PARTITIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPartitions {
			return c, fmt.Errorf("STATUS_PARTITIONS: %q is not a whole number from 1 to %d", v, maxPartitions)
		}
		c.Partitions = n
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
	if c.DashboardAddr != "" {
		if _, _, err := net.SplitHostPort(c.DashboardAddr); err != nil {
			return fmt.Errorf("DashboardAddr: %q is not host:port (DASHBOARD_ADDR=off turns the dashboard off): %v", c.DashboardAddr, err)
		}
		if !loopbackHost(c.DashboardAddr) && c.DashboardToken == "" {
			return fmt.Errorf("DashboardAddr: %q listens beyond loopback; set DASHBOARD_TOKEN so that only operators get in", c.DashboardAddr)
		}
	}
	if c.DashboardViewerToken != "" && (c.DashboardToken == "" || c.DashboardViewerToken == c.DashboardToken) {
		return fmt.Errorf("DashboardViewerToken: needs a DashboardToken (DASHBOARD_TOKEN) for operators, different from it")
	}
	if c.Retention < 0 {
		return fmt.Errorf("Retention: must not be negative")
	}
	if c.MaxEventStreams < 0 {
		return fmt.Errorf("MaxEventStreams: must not be negative")
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("PollInterval: must not be negative")
	}
	if c.Partitions < 0 || c.Partitions > maxPartitions {
		return fmt.Errorf("Partitions: must be from 1 to %d, got %d", maxPartitions, c.Partitions)
	}
	if c.SeriesLimit < 0 {
		return fmt.Errorf("SeriesLimit: must not be negative")
	}
	if c.LayoutSweep < 0 {
		return fmt.Errorf("LayoutSweep: must not be negative")
	}
	if c.AlertInterval < 0 || c.AlertDeadThreshold < 0 {
		return fmt.Errorf("AlertInterval, AlertDeadThreshold: must not be negative")
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
	if c.PollInterval == 0 {
		c.PollInterval = 3 * time.Second
	}
	if c.MaxEventStreams == 0 {
		c.MaxEventStreams = 64
	}
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	if c.AlertDeadThreshold == 0 {
		c.AlertDeadThreshold = 100
	}
	if c.LayoutSweep == 0 {
		c.LayoutSweep = 10 * time.Minute
	}
	if c.SeriesLimit == 0 {
		c.SeriesLimit = 64
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.metrics = metrics.NewStatus(c.Metrics)
}
