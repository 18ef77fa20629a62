package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Account defaults, applied when a field is absent or zero.
const (
	DefaultRatePerSec  = 10
	DefaultConcurrency = 4
)

// Bounds of the numeric account fields. No provider comes near them; they
// keep an absurd value (a rate of 1e19, a burst near the integer maximum)
// from overflowing the pacer's arithmetic, which crashed every replica that
// took the account's lease in turn.
const (
	MaxRatePerSec           = 1e6
	MaxBurst                = 1_000_000
	MaxConcurrency          = 1000
	MaxDailyCap             = 1_000_000_000
	MaxBatchLimit           = 100_000
	MaxRecoverAfter         = 1_000_000
	MaxPerRecipientInterval = 7 * 24 * time.Hour
)

// Account is a sender account, kept in KV broadcast_accounts under its name.
// Channel-specific fields stay in Raw for the channel adapter to read.
type Account struct {
	Name    string `json:"-"`
	Channel string `json:"channel"`
	// Endpoint overrides the provider's base URL (webhook: the URL posted to).
	Endpoint string `json:"endpoint,omitempty"`
	// SecretEnv names the environment variable holding the token or signing
	// secret. The secret itself never appears in KV. It must start with
	// SecretEnvPrefix or be allowed by dispatch (CheckSecretEnv).
	SecretEnv string `json:"secret_env,omitempty"`
	// RatePerSec is the account's send rate ceiling. Defaults to 10.
	RatePerSec float64 `json:"rate_per_sec"`
	// Burst is the token bucket size. Defaults to 1.
	Burst int `json:"burst"`
	// Concurrency caps in-flight requests (provider calls, for an account
	// with MaxBatch above 1). Defaults to 4.
	Concurrency int `json:"concurrency"`
	// DailyCap is distinct recipients per rolling 24 h; 0 means none.
	DailyCap int `json:"daily_cap"`
	// PerRecipientInterval is the minimum gap between two sends to one
	// recipient through this account. Defaults to 0s.
	PerRecipientInterval Duration `json:"per_recipient_interval"`
	// MaxBatch is how many recipients one provider call may carry; above 1,
	// for a channel that takes several per call (channels.BatchChannel),
	// dispatch merges recipients whose rendered text is identical into one
	// call, and RatePerSec, Burst and Concurrency count calls. Defaults to 1.
	MaxBatch int `json:"max_batch"`
	// MinRatePerSec is the floor adaptive pacing never goes below after
	// rate-limit answers (a storm takes the rate there). Defaults to
	// rate_per_sec/20.
	MinRatePerSec float64 `json:"min_rate_per_sec,omitempty"`
	// RecoverAfter is accepted for compatibility and no longer used:
	// adaptive pacing recovers by time, not by runs of successes (see
	// services/dispatch/adapt.go). Defaults to 50.
	RecoverAfter int `json:"recover_after,omitempty"`
	// Enabled is true unless set to false.
	Enabled *bool `json:"enabled,omitempty"`
	// Portfolio groups accounts that share one provider messaging limit
	// (a WhatsApp business portfolio): they share one rolling 24 h count
	// of distinct recipients, held to the limit the provider reports.
	Portfolio string `json:"portfolio,omitempty"`
	// Warmup is the account's warm-up ramp; nil when none.
	Warmup *Warmup `json:"warmup,omitempty"`
	// DigestBacklog turns digestible jobs (a task's digest_key without a
	// digest_window) into digests while more than this many jobs are
	// queued on the account; 0 means never (docs/digests.md).
	DigestBacklog int `json:"digest_backlog,omitempty"`

	Raw json.RawMessage `json:"-"`
}

// IsEnabled reports whether the account may send.
func (a *Account) IsEnabled() bool { return a.Enabled == nil || *a.Enabled }

// DecodeAccount parses and validates the account stored under name, filling
// defaults. Errors name the field.
func DecodeAccount(name string, data []byte) (*Account, error) {
	if !ValidID(name) {
		return nil, fieldErr("name", "account name must match [A-Za-z0-9_-]{1,64}, got %q", truncate(name, 80))
	}
	var a Account
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&a); err != nil {
		// The account's one duration field; encoding/json does not say
		// which field an UnmarshalJSON error came from.
		if de := (*durationError)(nil); errors.As(err, &de) {
			return nil, fieldErr("per_recipient_interval", "%v", de)
		}
		return nil, jsonFieldError("account", err)
	}
	a.Name = name
	a.Raw = append(json.RawMessage(nil), data...)
	if a.Channel == "" {
		return nil, fieldErr("channel", "required")
	}
	if err := checkSecretEnvSyntax(a.SecretEnv); err != nil {
		return nil, err
	}
	if a.RatePerSec == 0 {
		a.RatePerSec = DefaultRatePerSec
	}
	if !(a.RatePerSec > 0 && a.RatePerSec <= MaxRatePerSec) {
		return nil, fieldErr("rate_per_sec", "must be above 0 and at most %g, got %v", float64(MaxRatePerSec), a.RatePerSec)
	}
	if a.Burst == 0 {
		a.Burst = 1
	}
	if a.Burst < 0 || a.Burst > MaxBurst {
		return nil, fieldErr("burst", "must be between 1 and %d, got %d", MaxBurst, a.Burst)
	}
	if a.Concurrency == 0 {
		a.Concurrency = DefaultConcurrency
	}
	if a.Concurrency < 0 || a.Concurrency > MaxConcurrency {
		return nil, fieldErr("concurrency", "must be between 1 and %d, got %d", MaxConcurrency, a.Concurrency)
	}
	if a.DailyCap < 0 || a.DailyCap > MaxDailyCap {
		return nil, fieldErr("daily_cap", "must be between 0 (none) and %d, got %d", MaxDailyCap, a.DailyCap)
	}
	if a.PerRecipientInterval < 0 || a.PerRecipientInterval.D() > MaxPerRecipientInterval {
		return nil, fieldErr("per_recipient_interval", "must be between 0s and %s, got %s", MaxPerRecipientInterval, a.PerRecipientInterval.D())
	}
	if !(a.MinRatePerSec >= 0 && a.MinRatePerSec <= a.RatePerSec) {
		return nil, fieldErr("min_rate_per_sec", "must be between 0 and rate_per_sec (%v), got %v", a.RatePerSec, a.MinRatePerSec)
	}
	if a.MinRatePerSec == 0 {
		a.MinRatePerSec = a.RatePerSec / 20
	}
	if a.RecoverAfter < 0 || a.RecoverAfter > MaxRecoverAfter {
		return nil, fieldErr("recover_after", "must be between 1 and %d, got %d", MaxRecoverAfter, a.RecoverAfter)
	}
	if a.RecoverAfter == 0 {
		a.RecoverAfter = 50
	}
	if a.MaxBatch == 0 {
		a.MaxBatch = 1
	}
	if a.MaxBatch < 0 || a.MaxBatch > MaxBatchLimit {
		return nil, fieldErr("max_batch", "must be between 1 and %d, got %d", MaxBatchLimit, a.MaxBatch)
	}
	if a.DigestBacklog < 0 || a.DigestBacklog > MaxDailyCap {
		return nil, fieldErr("digest_backlog", "must be between 0 (never) and %d, got %d", MaxDailyCap, a.DigestBacklog)
	}
	if a.Portfolio != "" && !ValidID(a.Portfolio) {
		return nil, fieldErr("portfolio", "must match [A-Za-z0-9_-]{1,64}, got %q", truncate(a.Portfolio, 80))
	}
	if a.Warmup != nil {
		if err := a.Warmup.check(); err != nil {
			return nil, err
		}
	}
	return &a, nil
}

// Duration is a time.Duration that reads and writes Go duration strings
// ("6s", "1m30s") and also accepts a number of seconds.
type Duration time.Duration

// UnmarshalJSON accepts "1.5s" or 1.5 (seconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s == "" {
			*d = 0
			return nil
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return &durationError{fmt.Sprintf("invalid duration %q (want e.g. \"6s\")", s)}
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return &durationError{`duration must be a string like "6s" or a number of seconds`}
	}
	// Beyond ±292 years the conversion to nanoseconds overflows.
	if math.IsNaN(secs) || math.Abs(secs) > maxDurationSeconds {
		return &durationError{fmt.Sprintf("duration of %g seconds is out of range", secs)}
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// durationError is a Duration that does not parse.
type durationError struct{ msg string }

func (e *durationError) Error() string { return e.msg }

// maxDurationSeconds is the longest duration a number of seconds may give.
const maxDurationSeconds = float64(math.MaxInt64/int64(time.Second)) - 1

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
