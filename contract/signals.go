package contract

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// BucketSignals is KV broadcast_signals: what a provider says about an
// account (its quality rating and messaging limit), keyed by account name.
// feedback writes it from account-level webhooks; operators may write it
// too (nats kv put), e.g. from the provider's console. dispatch applies it
// to pacing and daily caps, status to the health score.
const BucketSignals = "broadcast_signals"

// Quality ratings, as WhatsApp reports them for a phone number.
const (
	QualityGreen   = "GREEN"
	QualityYellow  = "YELLOW"
	QualityRed     = "RED"
	QualityUnknown = "UNKNOWN"
)

// CodeQualityRed is the code of a retrying event whose marketing job
// waits because its account's quality is RED and no other account of its
// pool can take it.
const CodeQualityRed = "quality_red"

// MessagingLimitUnlimited is the messaging_limit of an account the provider
// does not cap.
const MessagingLimitUnlimited = -1

// AccountSignals is the value of KV broadcast_signals.
type AccountSignals struct {
	// Quality is GREEN, YELLOW, RED or UNKNOWN ("" reads as UNKNOWN).
	// YELLOW halves the account's rate ceiling until it recovers; RED
	// halves it and holds the account's marketing sends.
	Quality string `json:"quality,omitempty"`
	// MessagingLimit is distinct recipients per rolling 24 h as the
	// provider reports it: 0 when not reported, -1 for unlimited. It
	// replaces the account's tier; for an account with a portfolio it is
	// the portfolio's limit.
	MessagingLimit int `json:"messaging_limit,omitempty"`
	// Tier is the provider's name for the limit, e.g. TIER_2K.
	Tier string `json:"tier,omitempty"`
	// Event is the provider's event that set the value, e.g. FLAGGED.
	Event string `json:"event,omitempty"`
	// Source says who wrote it: whatsapp (a webhook), or an operator's tag.
	Source string    `json:"source,omitempty"`
	At     time.Time `json:"at"`
}

// DecodeAccountSignals parses and checks a broadcast_signals value; errors
// name the field.
func DecodeAccountSignals(data []byte) (*AccountSignals, error) {
	var s AccountSignals
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&s); err != nil {
		return nil, jsonFieldError("signals", err)
	}
	s.Quality = strings.ToUpper(strings.TrimSpace(s.Quality))
	switch s.Quality {
	case "", QualityGreen, QualityYellow, QualityRed, QualityUnknown:
	default:
		return nil, fieldErr("quality", "want GREEN, YELLOW, RED or UNKNOWN, got %q", truncate(s.Quality, 32))
	}
	if s.MessagingLimit < MessagingLimitUnlimited || s.MessagingLimit > MaxDailyCap {
		return nil, fieldErr("messaging_limit", "must be -1 (unlimited), 0 (not reported) or up to %d, got %d", MaxDailyCap, s.MessagingLimit)
	}
	return &s, nil
}

// RateFactor is what the quality does to the account's rate ceiling.
func (s *AccountSignals) RateFactor() float64 {
	if s != nil && (s.Quality == QualityYellow || s.Quality == QualityRed) {
		return 0.5
	}
	return 1
}

// HoldsMarketing reports whether the quality holds marketing sends (RED).
func (s *AccountSignals) HoldsMarketing() bool { return s != nil && s.Quality == QualityRed }

// whatsappLimitTiers maps WhatsApp's messaging-limit tier names onto
// recipients per rolling 24 h (-1: unlimited).
var whatsappLimitTiers = map[string]int{
	"TIER_50": 50, "TIER_250": 250, "TIER_1K": 1_000, "TIER_2K": 2_000, "TIER_10K": 10_000,
	"TIER_100K": 100_000, "TIER_UNLIMITED": MessagingLimitUnlimited,
}

// WhatsAppLimitTier reads a tier name of Meta's webhooks (TIER_2K,
// TIER_UNLIMITED, ...); ok is false for TIER_NOT_SET and unknown names.
func WhatsAppLimitTier(tier string) (limit int, ok bool) {
	limit, ok = whatsappLimitTiers[strings.ToUpper(strings.TrimSpace(tier))]
	return limit, ok
}

// QualityOrUnknown is the quality rating, UNKNOWN when none is recorded.
func (s *AccountSignals) QualityOrUnknown() string {
	if s == nil || s.Quality == "" {
		return QualityUnknown
	}
	return s.Quality
}
