package feedback

import (
	"context"
	"fmt"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// WhatsApp codes that feed the suppression list.
const (
	// waMarketingLimit (131049): the user got too many marketing messages;
	// Meta advises not to retry for 24 h.
	waMarketingLimit = "131049"
	// waMarketingOptOut (131050): the user stopped marketing messages.
	waMarketingOptOut = "131050"
)

// MarketingHold is how long a 131049 holds a recipient's marketing sends.
const MarketingHold = 24 * time.Hour

// The scopes receipts suppress in: the channel each source reports for.
const (
	scopeWhatsApp = "whatsapp"
	scopeEmail    = "smtp"
)

// suppression is the suppression entry a receipt asks for, if any:
//   - WhatsApp 131050: an opt-out of marketing (scope whatsapp);
//   - WhatsApp 131049: a hold of marketing sends, reason frequency_cap,
//     until 24 h after the provider's time, so later marketing tasks skip
//     the recipient with code suppressed instead of sending into the
//     limit; other categories still send;
//   - an email hard bounce (reason bounce) or complaint (reason
//     complaint): every category (scope smtp).
//
// Other receipts (131026 included: undelivered, and nothing re-sends an
// undelivered message) add nothing.
func suppression(rc *Receipt) (scope string, e contract.Suppression, ok bool) {
	marketing := []contract.Category{contract.CategoryMarketing}
	switch {
	case rc.Source == SourceWhatsApp && rc.Status == StatusFailed && rc.To != "":
		switch rc.Code {
		case waMarketingOptOut:
			return scopeWhatsApp, contract.Suppression{To: rc.To, Reason: contract.ReasonOptOut, Categories: marketing}, true
		case waMarketingLimit:
			at := rc.At
			if at.IsZero() || at.After(rc.Received) {
				at = rc.Received
			}
			until := at.Add(MarketingHold).UTC()
			return scopeWhatsApp, contract.Suppression{To: rc.To, Reason: contract.ReasonFrequencyCap, Categories: marketing, Until: &until}, true
		}
	case rc.Source == SourceBounce && rc.Status == BounceHard:
		return scopeEmail, contract.Suppression{To: rc.Email, Reason: contract.ReasonBounce}, true
	case rc.Source == SourceBounce && rc.Status == BounceComplaint:
		return scopeEmail, contract.Suppression{To: rc.Email, Reason: contract.ReasonComplaint}, true
	}
	return "", contract.Suppression{}, false
}

// suppressFrom writes the receipt's suppression entry, merged so that a
// repeated or reordered receipt never weakens an entry (suppress.List.Merge).
// A recipient that does not normalize is logged (without it: the reason
// would quote it) and skipped; a failed write retries the receipt.
func (s *Service) suppressFrom(ctx context.Context, rc *Receipt) error {
	scope, e, ok := suppression(rc)
	if !ok {
		return nil
	}
	e.Source, e.At = "feedback", rc.Received.UTC()
	probe := e
	if _, err := suppress.Prepare(scope, &probe); err != nil {
		s.log.Warn("receipt's recipient does not normalize; not suppressed", "source", rc.Source, shared.KeyAccount, rc.Account,
			"code", rc.Code)
		return nil
	}
	key, err := s.suppressions.Merge(ctx, scope, e)
	if err != nil {
		return fmt.Errorf("suppression entry: %w", err)
	}
	s.log.Debug("recipient suppressed from a receipt", "key", key, "reason", e.Reason)
	return nil
}
