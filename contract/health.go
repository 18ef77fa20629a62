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
	// DailyUsed and DailyCap describe the rolling 24 h window.
	DailyUsed int       `json:"daily_used"`
	DailyCap  int       `json:"daily_cap"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Healthy reports whether the account may receive work.
func (h *AccountHealth) Healthy() bool { return h == nil || h.State != HealthPaused }

// Remaining is how many new recipients the account can still take in the
// rolling window, or -1 when it has no cap.
func (h *AccountHealth) Remaining() int {
	if h == nil || h.DailyCap <= 0 {
		return -1
	}
	return max(h.DailyCap-h.DailyUsed, 0)
}
