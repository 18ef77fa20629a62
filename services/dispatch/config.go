package dispatch

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// Config tunes the dispatch service.
type Config struct {
	// BackoffBase is the delay before the second attempt; each further
	// attempt doubles it. Defaults to 1 second.
	BackoffBase time.Duration
	// BackoffMax caps the retry delay. Defaults to 5 minutes.
	BackoffMax time.Duration
	// LongWait is the shortest retry wait handed to a JetStream scheduled
	// message instead of NakWithDelay, which would hold a MaxAckPending slot
	// for the whole wait. Defaults to 3 seconds.
	LongWait time.Duration
	// NoHealthyWait is how long a job waits when its account cannot send
	// and no healthy account of its pool can take it. Defaults to 30 seconds.
	NoHealthyWait time.Duration
	// DigestWindow is the window of digests an account's backlog opens
	// (contract.Account.DigestBacklog) for tasks with a digest_key and no
	// digest_window of their own. Defaults to 1 minute.
	DigestWindow time.Duration
	// HealthInterval is how often the active owner of an account refreshes
	// its health value. Defaults to 2 seconds.
	HealthInterval time.Duration
	// SessionIdle is how long an account's session stays without a job
	// before it ends and the account sleeps: no lease, no pull request, no
	// timer (idle.go). Defaults to 10 seconds.
	SessionIdle time.Duration
	// KeptConsumers is how many of this replica's sleeping accounts keep
	// their normal lane's consumer on JOBS, so that waking them costs the
	// server no consumer; the others' is deleted (idle.go: each consumer
	// costs every acknowledgement of JOBS). Defaults to 1,000; a negative
	// count keeps none.
	KeptConsumers int
	// ReapInterval is how often the runners of deleted accounts are
	// checked and stopped once nothing of theirs is left to move. Defaults
	// to 30 seconds.
	ReapInterval time.Duration
	// MaxInFlight caps the provider calls this replica makes at once, over
	// all its accounts: a replica's own capacity (connections, CPU), where
	// an account's concurrency is the provider's limit. 0, the default,
	// means no cap beyond the accounts'. With it, replicas add capacity:
	// accounts spread evenly over them (lease.FairShare). Set it above the sum of
	// the concurrency of slow-paced accounts, whose jobs hold a slot while
	// they wait for their turn.
	MaxInFlight int
	// Channels defaults to channels.BuiltinWith the policy of DenyPrivate
	// and AllowLoopback.
	Channels channels.Registry
	// Getenv resolves accounts' secret_env. Defaults to os.Getenv.
	Getenv func(string) string
	// SecretEnvs lists the environment variables an account's secret_env
	// may name besides those starting with contract.SecretEnvPrefix
	// (BROADCAST_SECRET_). Reserved names (NATS_* and other well-known
	// variables, contract.ReservedEnv) are refused. Defaults to none.
	SecretEnvs []string
	// DenyPrivate refuses provider connections to private, link-local,
	// shared, multicast and loopback addresses, checked on the address
	// dialled (channels.NetPolicy). Defaults to false.
	DenyPrivate bool
	// AllowLoopback keeps 127.0.0.0/8 and ::1 reachable with DenyPrivate.
	// Defaults to false.
	AllowLoopback bool
	// Metrics is the registry the service's metrics join. Defaults to nil
	// (no metrics).
	Metrics *prometheus.Registry
	// Suppressions, when set, gives the suppression list's view shared
	// with the process's other services; nil: the service loads its own.
	Suppressions *suppress.Shared
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Now is the clock of the recipient policy (quiet hours and frequency
	// cap windows), a fake one in tests. Defaults to time.Now.
	Now func() time.Time

	// metrics is the service's metric set in Metrics, built by withDefaults.
	metrics *metrics.Dispatch
}

// ConfigFromEnv reads DISPATCH_BACKOFF_BASE, DISPATCH_BACKOFF_MAX,
// DISPATCH_LONG_WAIT, DISPATCH_REAP_INTERVAL, DISPATCH_DIGEST_WINDOW and
// DISPATCH_SESSION_IDLE (Go durations), DISPATCH_MAX_IN_FLIGHT and
// DISPATCH_KEPT_CONSUMERS (counts),
// DISPATCH_SECRET_ENVS (comma-separated names), DISPATCH_DENY_PRIVATE and
// DISPATCH_ALLOW_LOOPBACK (1 or true).
func ConfigFromEnv() (Config, error) {
	var c Config
	for _, n := range strings.Split(os.Getenv("DISPATCH_SECRET_ENVS"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.SecretEnvs = append(c.SecretEnvs, n)
		}
	}
	for name, dst := range map[string]*bool{"DISPATCH_DENY_PRIVATE": &c.DenyPrivate, "DISPATCH_ALLOW_LOOPBACK": &c.AllowLoopback} {
		if v := os.Getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return c, fmt.Errorf("%s: %q is not 1, 0, true or false", name, v)
			}
			*dst = b
		}
	}
	for name, dst := range map[string]*time.Duration{
		"DISPATCH_BACKOFF_BASE":  &c.BackoffBase,
		"DISPATCH_BACKOFF_MAX":   &c.BackoffMax,
		"DISPATCH_LONG_WAIT":     &c.LongWait,
		"DISPATCH_REAP_INTERVAL": &c.ReapInterval,
		"DISPATCH_DIGEST_WINDOW": &c.DigestWindow,
		"DISPATCH_SESSION_IDLE":  &c.SessionIdle,
	} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return c, fmt.Errorf("%s: %q is not a duration like 1s", name, v)
			}
			*dst = d
		}
	}
	if v := os.Getenv("DISPATCH_MAX_IN_FLIGHT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c, fmt.Errorf("DISPATCH_MAX_IN_FLIGHT: %q is not a count like 64", v)
		}
		c.MaxInFlight = n
	}
	if v := os.Getenv("DISPATCH_KEPT_CONSUMERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("DISPATCH_KEPT_CONSUMERS: %q is not a count like 1000 (-1 keeps none)", v)
		}
		c.KeptConsumers = n
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if err := contract.CheckSecretEnvAllowList(c.SecretEnvs); err != nil {
		return fmt.Errorf("SecretEnvs (DISPATCH_SECRET_ENVS): %v", err)
	}
	if c.DenyPrivate && c.Channels != nil {
		return fmt.Errorf("DenyPrivate: applies to the built-in channels; build Channels with channels.BuiltinWith instead")
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("MaxInFlight: must not be negative")
	}
	if c.BackoffBase < 0 {
		return fmt.Errorf("BackoffBase: must not be negative")
	}
	if c.SessionIdle < 0 {
		return fmt.Errorf("SessionIdle (DISPATCH_SESSION_IDLE): must not be negative")
	}
	if c.BackoffMax < 0 {
		return fmt.Errorf("BackoffMax: must not be negative")
	}
	if c.DigestWindow != 0 && (c.DigestWindow < contract.MinDigestWindow || c.DigestWindow > contract.MaxDigestWindow) {
		return fmt.Errorf("DigestWindow (DISPATCH_DIGEST_WINDOW): must be between %s and %s, got %s", contract.MinDigestWindow, contract.MaxDigestWindow, c.DigestWindow)
	}
	if c.BackoffBase > 0 && c.BackoffMax > 0 && c.BackoffMax < c.BackoffBase {
		return fmt.Errorf("BackoffMax: %s is below BackoffBase %s", c.BackoffMax, c.BackoffBase)
	}
	return nil
}

func (c *Config) withDefaults() {
	if c.BackoffBase == 0 {
		c.BackoffBase = time.Second
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 5 * time.Minute
	}
	if c.LongWait == 0 {
		c.LongWait = 3 * time.Second
	}
	if c.NoHealthyWait == 0 {
		c.NoHealthyWait = 30 * time.Second
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 30 * time.Second
	}
	if c.DigestWindow == 0 {
		c.DigestWindow = time.Minute
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 2 * time.Second
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = 10 * time.Second
	}
	if c.KeptConsumers == 0 {
		c.KeptConsumers = 1000
	}
	if c.Channels == nil {
		c.Channels = channels.BuiltinWith(channels.NetPolicy{DenyPrivate: c.DenyPrivate, AllowLoopback: c.AllowLoopback})
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.metrics = metrics.NewDispatch(c.Metrics)
}
