package channels

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// Sandbox is a simulated provider inside the dispatch process, for demos,
// benchmarks and tests. With every option zero it accepts everything at no
// cost, so a benchmark measures the pipeline alone.
//
// A Send with several messages (an account with max_batch > 1) is one
// simulated call: it waits Latency once, and one draw decides whether the
// call is answered 429 or 503 for all its messages; recipients matching
// PermanentPrefix or FatalPrefix get their own answer, as a provider's
// per-recipient validation would give.
type Sandbox struct {
	// Stats, when set, counts the calls of every sender this channel
	// builds, so tests can assert how many provider calls a task took.
	// Defaults to nil (not counted).
	Stats *SandboxStats
}

// SandboxStats counts simulated provider calls. It is safe for concurrent use.
type SandboxStats struct {
	// Calls is how many Sends (simulated provider calls) were made.
	Calls atomic.Int64
	// Messages is how many messages those calls carried.
	Messages atomic.Int64
}

// SandboxMaxBatch is the most messages one simulated call takes.
const SandboxMaxBatch = 10_000

// Name implements Channel.
func (Sandbox) Name() string { return "sandbox" }

// MaxBatch implements BatchChannel.
func (Sandbox) MaxBatch() int { return SandboxMaxBatch }

// NormalizeRecipient accepts what the webhook channel accepts.
func (Sandbox) NormalizeRecipient(to string) (string, error) { return Webhook{}.NormalizeRecipient(to) }

// CheckBody accepts any body within the global limit.
func (Sandbox) CheckBody(string) error { return nil }

// SandboxOptions are the sandbox-specific account fields.
type SandboxOptions struct {
	// Latency of every call. Defaults to 0.
	Latency contract.Duration `json:"latency"`
	// FailRate is the share of calls answered with a retryable 503.
	FailRate float64 `json:"fail_rate"`
	// RateLimitedRate is the share of calls answered with 429.
	RateLimitedRate float64 `json:"rate_limited_rate"`
	// RetryAfter is sent with simulated 429s. Defaults to 1s.
	RetryAfter contract.Duration `json:"retry_after"`
	// PermanentPrefix: recipients starting with it are rejected permanently.
	PermanentPrefix string `json:"permanent_prefix"`
	// FatalPrefix: recipients starting with it get an account-fatal answer.
	FatalPrefix string `json:"fatal_prefix"`
}

// NewSender implements Channel.
func (c Sandbox) NewSender(acct *contract.Account, _ func(string) string) (Sender, error) {
	var o SandboxOptions
	if err := decodeOptions(acct, &o); err != nil {
		return nil, err
	}
	for name, v := range map[string]float64{"fail_rate": o.FailRate, "rate_limited_rate": o.RateLimitedRate} {
		if v < 0 || v > 1 {
			return nil, fmt.Errorf("%s: must be between 0 and 1, got %v", name, v)
		}
	}
	if o.RetryAfter == 0 {
		o.RetryAfter = contract.Duration(time.Second)
	}
	return &sandboxSender{opts: o, stats: c.Stats}, nil
}

type sandboxSender struct {
	opts  SandboxOptions
	stats *SandboxStats
}

// Send simulates one provider call carrying msgs.
func (s *sandboxSender) Send(ctx context.Context, msgs []Message) []Result {
	if s.stats != nil {
		s.stats.Calls.Add(1)
		s.stats.Messages.Add(int64(len(msgs)))
	}
	if d := s.opts.Latency.D(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return Fail(len(msgs), Result{Class: contract.ClassRetryable, Code: "timeout", Err: ctx.Err().Error()})
		case <-t.C:
		}
	}
	// The call's answer is drawn once (and only when some message is not
	// decided by its recipient), so a single-message Send draws exactly as
	// often as before batches existed.
	var call *Result
	drawn := false
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		if r, ok := s.byRecipient(m); ok {
			out[i] = r
			continue
		}
		if !drawn {
			call, drawn = s.draw(), true
		}
		if call != nil {
			out[i] = *call
			continue
		}
		out[i] = Result{ProviderID: "sbx-" + m.ID}
	}
	return out
}

// byRecipient answers recipients matching FatalPrefix or PermanentPrefix.
func (s *sandboxSender) byRecipient(m Message) (Result, bool) {
	o := s.opts
	switch {
	case o.FatalPrefix != "" && strings.HasPrefix(m.To, o.FatalPrefix):
		return Result{Class: contract.ClassAccountFatal, Code: "401", Err: "sandbox: account token revoked"}, true
	case o.PermanentPrefix != "" && strings.HasPrefix(m.To, o.PermanentPrefix):
		return Result{Class: contract.ClassPermanent, Code: "400", Err: "sandbox: recipient rejected"}, true
	}
	return Result{}, false
}

// draw decides whether a call fails as a whole (429 or 503); nil means it
// is accepted.
func (s *sandboxSender) draw() *Result {
	o := s.opts
	if o.RateLimitedRate <= 0 && o.FailRate <= 0 {
		return nil
	}
	x := rand.Float64()
	if x < o.RateLimitedRate {
		return &Result{Class: contract.ClassRateLimited, Code: "429", Err: "sandbox: rate limited", RetryAfter: o.RetryAfter.D()}
	}
	if x < o.RateLimitedRate+o.FailRate {
		return &Result{Class: contract.ClassRetryable, Code: "503", Err: "sandbox: service unavailable"}
	}
	return nil
}
