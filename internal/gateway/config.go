package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// ErrInvalidConfig is wrapped by every error New returns for a bad Config;
// the message names the field.
var ErrInvalidConfig = errors.New("gateway: invalid config")

// Config tunes the simulated provider. The zero value accepts every
// well-formed request at once, so a benchmark measures the client alone.
//
// FailRate, RateLimitedRate and TimeoutRate share one random draw per request:
// their sum must not exceed 1, and each is the exact long-run share of
// requests (among those that pass signature, parsing, rate limit and prefix
// checks) answered with that fault.
type Config struct {
	// FailRate is the share of requests answered 503 (retryable). Defaults to 0.
	FailRate float64
	// RateLimitedRate is the share of requests answered 429 with Retry-After.
	// Defaults to 0.
	RateLimitedRate float64
	// RetryAfter is the Retry-After sent with injected 429s, with 429s for
	// exceeding RatePerSec and during a storm (Gateway.Storm), in whole
	// seconds rounded up, at least 1. A refusal whose next token is further
	// away than RetryAfter advertises that wait instead. Defaults to 1s.
	RetryAfter time.Duration
	// OmitInjectedRetryAfter sends the 429s drawn by RateLimitedRate without
	// a Retry-After header, as providers that signal a rate limit in the
	// body only do (WhatsApp's 130429). Defaults to false.
	OmitInjectedRetryAfter bool
	// TimeoutRate is the share of requests that hang for Hang and then get 504
	// (or nothing, if the client gives up first). Defaults to 0.
	TimeoutRate float64
	// Hang is how long a timed-out request hangs before its 504. Defaults to 15s.
	Hang time.Duration
	// Latency is added to every send request before it is decided. A request
	// whose client gives up during Latency is still decided and recorded, as
	// at a real provider, so a client timeout can turn into a duplicate
	// delivery on retry. Defaults to 0.
	Latency time.Duration
	// PermanentPrefix: recipients ("to") starting with it get 400 (permanent).
	// Defaults to "" (none).
	PermanentPrefix string
	// FatalPrefix: recipients starting with it get 401 (account-fatal); it
	// wins over PermanentPrefix when both match. Defaults to "" (none).
	FatalPrefix string
	// RatePerSec is the per-account (body "account") request rate enforced by
	// a token bucket; requests over it get 429 with Retry-After and are counted
	// as Refused. Every request that passes the bucket takes a token, whatever
	// its answer. Defaults to 0 (no limit).
	RatePerSec float64
	// Burst is the token bucket size for RatePerSec. Defaults to 1.
	Burst int
	// Secret, when set, makes the gateway check X-Broadcast-Signature
	// (sha256=<hex HMAC-SHA256 of the raw body>); requests whose signature is
	// missing or wrong get 401 and are counted as BadSignature. The secret is
	// never logged or returned. Defaults to "" (no check).
	Secret string
	// Unauthorized answers every well-formed send 401 (account fatal), as a
	// provider does for a revoked token; it is decided after the rate limit
	// and counted under Injected["401"]. Defaults to false.
	Unauthorized bool
	// NoRetryAfter leaves Retry-After off every 429, injected or for
	// exceeding RatePerSec, as providers that do not send it. Defaults to
	// false (Retry-After is sent).
	NoRetryAfter bool
	// Tape, when set, answers the requests it has an answer for (by
	// Idempotency-Key and attempt) as recorded, before any other fault
	// decision; requests it has none for are decided as without it. See
	// Tape. Defaults to nil.
	Tape *Tape
	// Seed seeds fault injection. When non-zero every fault decision is a hash
	// of (Seed, Idempotency-Key, attempt), so runs are reproducible whatever
	// the arrival order; rate limiting depends on time and is not. Defaults to
	// 0 (a fresh random draw per request).
	Seed uint64
}

// Defaults applied by withDefaults.
const (
	defaultRetryAfter = time.Second
	defaultHang       = 15 * time.Second
	defaultBurst      = 1
)

// withDefaults returns c with zero fields that have a non-zero default filled.
func (c Config) withDefaults() Config {
	if c.RetryAfter == 0 {
		c.RetryAfter = defaultRetryAfter
	}
	if c.Hang == 0 {
		c.Hang = defaultHang
	}
	if c.Burst == 0 {
		c.Burst = defaultBurst
	}
	return c
}

// validate reports the first bad field of c, after defaults.
func (c Config) validate() error {
	rates := []struct {
		name string
		v    float64
	}{{"FailRate", c.FailRate}, {"RateLimitedRate", c.RateLimitedRate}, {"TimeoutRate", c.TimeoutRate}}
	for _, r := range rates {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%w: %s: %v is not between 0 and 1", ErrInvalidConfig, r.name, r.v)
		}
	}
	if sum := c.FailRate + c.RateLimitedRate + c.TimeoutRate; sum > 1+1e-9 {
		return fmt.Errorf("%w: FailRate+RateLimitedRate+TimeoutRate: %v exceeds 1", ErrInvalidConfig, sum)
	}
	durations := []struct {
		name string
		v    time.Duration
	}{{"RetryAfter", c.RetryAfter}, {"Hang", c.Hang}, {"Latency", c.Latency}}
	for _, d := range durations {
		if d.v < 0 {
			return fmt.Errorf("%w: %s: %v is negative", ErrInvalidConfig, d.name, d.v)
		}
	}
	if math.IsNaN(c.RatePerSec) || math.IsInf(c.RatePerSec, 0) || c.RatePerSec < 0 {
		return fmt.Errorf("%w: RatePerSec: %v is not a finite number >= 0", ErrInvalidConfig, c.RatePerSec)
	}
	if c.Burst < 0 {
		return fmt.Errorf("%w: Burst: %d is negative", ErrInvalidConfig, c.Burst)
	}
	if err := c.Tape.validate(); err != nil {
		return fmt.Errorf("%w: Tape: %v", ErrInvalidConfig, err)
	}
	return nil
}

// LogValue implements slog.LogValuer so a logged Config never shows Secret.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Float64("fail_rate", c.FailRate),
		slog.Float64("rate_limited_rate", c.RateLimitedRate),
		slog.Duration("retry_after", c.RetryAfter),
		slog.Bool("omit_injected_retry_after", c.OmitInjectedRetryAfter),
		slog.Float64("timeout_rate", c.TimeoutRate),
		slog.Duration("hang", c.Hang),
		slog.Duration("latency", c.Latency),
		slog.String("permanent_prefix", c.PermanentPrefix),
		slog.String("fatal_prefix", c.FatalPrefix),
		slog.Float64("rate_per_sec", c.RatePerSec),
		slog.Int("burst", c.Burst),
		slog.Bool("signed", c.Secret != ""),
		slog.Bool("unauthorized", c.Unauthorized),
		slog.Bool("no_retry_after", c.NoRetryAfter),
		slog.Int("tape_keys", c.Tape.keys()),
		slog.Uint64("seed", c.Seed),
	)
}

// String describes c without its Secret, so fmt verbs cannot leak it either.
func (c Config) String() string {
	return fmt.Sprintf("gateway.Config{%s}", c.LogValue())
}

// retryAfterSeconds renders d as a Retry-After value: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// GoString keeps %#v from printing Secret.
func (c Config) GoString() string { return c.String() }
