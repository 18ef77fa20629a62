package contract

import "time"

// Account health states.
const (
	HealthHealthy = "healthy"
	// HealthPaused: the account answered with an account-fatal error (or
	// repeated auth failures). It sends nothing until its account value is
	// edited; its queued jobs move to healthy accounts of the channel.
	HealthPaused = "paused"
)

// AccountHealth is kept in KV broadcast_health under the account name by
// the dispatch process that owns the account.
type AccountHealth struct {
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
	// RatePerSec is the effective (adaptive) rate; Ceiling the configured one.
	RatePerSec float64 `json:"rate_per_sec"`
	Ceiling    float64 `json:"ceiling"`
	// DailyUsed and DailyCap describe the rolling 24 h window. DailyCap is
	// the account's own cap: the lowest of daily_cap, the warm-up cap and
	// (outside a portfolio) the provider's messaging limit.
	DailyUsed int `json:"daily_used"`
	DailyCap  int `json:"daily_cap"`
	// WarmupCap and WarmupDay describe the warm-up ramp (0 without one).
	WarmupCap int `json:"warmup_cap,omitempty"`
	WarmupDay int `json:"warmup_day,omitempty"`
	// Portfolio, PortfolioUsed and PortfolioCap describe the count the
	// account shares with its portfolio's other accounts.
	Portfolio     string `json:"portfolio,omitempty"`
	PortfolioUsed int    `json:"portfolio_used,omitempty"`
	PortfolioCap  int    `json:"portfolio_cap,omitempty"`
	// Quality is the provider's quality rating (KV broadcast_signals);
	// MarketingHeld says RED holds the account's marketing sends, with the
	// reason in QualityReason.
	Quality       string    `json:"quality,omitempty"`
	MarketingHeld bool      `json:"marketing_held,omitempty"`
	QualityReason string    `json:"quality_reason,omitempty"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Healthy reports whether the account may receive work.
func (h *AccountHealth) Healthy() bool { return h == nil || h.State != HealthPaused }

// Remaining is how many new recipients the account can still take in the
// rolling window (its own cap and its portfolio's), or -1 when it has no
// cap.
func (h *AccountHealth) Remaining() int {
	if h == nil {
		return -1
	}
	own, shared := -1, -1
	if h.DailyCap > 0 {
		own = max(h.DailyCap-h.DailyUsed, 0)
	}
	if h.PortfolioCap > 0 {
		shared = max(h.PortfolioCap-h.PortfolioUsed, 0)
	}
	switch {
	case own < 0:
		return shared
	case shared < 0:
		return own
	}
	return min(own, shared)
}
