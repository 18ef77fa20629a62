package feedback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
)

// WhatsApp's account-level webhook phone_number_quality_update reports a
// phone number's quality and messaging limit: event FLAGGED (quality fell
// to low, RED), UNFLAGGED (it recovered), DOWNGRADE/UPGRADE (the limit
// changed), with current_limit and, since 2025, the portfolio's
// max_daily_conversations_per_business as tier names (TIER_2K, ...).
// Payloads relayed by providers may also carry quality_rating (GREEN,
// YELLOW, RED), which wins over the event. The number is named by
// display_phone_number, matched to the WhatsApp account whose
// display_phone_number field has the same digits. feedback writes what it
// learns to KV broadcast_signals under the account; dispatch applies it.

// fieldQualityUpdate is the webhook field feedback reads for signals.
const fieldQualityUpdate = "phone_number_quality_update"

// qualityUpdate is one parsed phone_number_quality_update.
type qualityUpdate struct {
	DisplayPhone string
	Quality      string // "" when the update says nothing of it
	Limit        int    // 0 when it says nothing of it, -1 unlimited
	Tier         string
	Event        string
	At           time.Time
}

// whatsappAccountPayload is the part of Meta's payload feedback reads for
// account-level fields.
type whatsappAccountPayload struct {
	Entry []struct {
		Time    int64 `json:"time"`
		Changes []struct {
			Field string `json:"field"`
			Value struct {
				DisplayPhoneNumber string `json:"display_phone_number"`
				Event              string `json:"event"`
				CurrentLimit       string `json:"current_limit"`
				MaxDailyPerBiz     string `json:"max_daily_conversations_per_business"`
				QualityRating      string `json:"quality_rating"`
			} `json:"value"`
		} `json:"changes"`
	} `json:"entry"`
}

// parseQualityUpdates returns the payload's quality updates (none when it
// has only statuses). An error names the field.
func parseQualityUpdates(body []byte, received time.Time) ([]qualityUpdate, error) {
	var p whatsappAccountPayload
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, jsonError("payload", err)
	}
	var out []qualityUpdate
	for i, e := range p.Entry {
		for j, c := range e.Changes {
			if c.Field != fieldQualityUpdate {
				continue
			}
			at := fmt.Sprintf("entry[%d].changes[%d].value", i, j)
			v := c.Value
			phone := digits(v.DisplayPhoneNumber)
			if phone == "" || len(phone) > 20 {
				return nil, fmt.Errorf("%s.display_phone_number: required, up to 20 digits", at)
			}
			u := qualityUpdate{DisplayPhone: phone, Event: clip(strings.ToUpper(strings.TrimSpace(v.Event)), 32), At: received}
			if e.Time > 0 && e.Time < 1<<40 {
				u.At = time.Unix(e.Time, 0).UTC()
			}
			switch u.Event {
			case "FLAGGED":
				u.Quality = contract.QualityRed
			case "UNFLAGGED":
				u.Quality = contract.QualityGreen
			}
			if q := strings.ToUpper(strings.TrimSpace(v.QualityRating)); q != "" {
				switch q {
				case contract.QualityGreen, contract.QualityYellow, contract.QualityRed, contract.QualityUnknown:
					u.Quality = q
				case "NA":
					u.Quality = contract.QualityUnknown
				default:
					return nil, fmt.Errorf("%s.quality_rating: want GREEN, YELLOW, RED or UNKNOWN, got %q", at, clip(q, 32))
				}
			}
			for _, tier := range []string{v.MaxDailyPerBiz, v.CurrentLimit} {
				if limit, ok := contract.WhatsAppLimitTier(tier); ok {
					u.Limit, u.Tier = limit, strings.ToUpper(strings.TrimSpace(tier))
					break
				}
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// digits keeps the digits of a phone number.
func digits(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// applySignals merges an update into the account's broadcast_signals
// value: what the update says replaces what was there, unless the stored
// value is newer (webhooks arrive out of order). Concurrent writers are
// ordered by compare-and-set on the key's revision.
func applySignals(ctx context.Context, kv jetstream.KeyValue, account string, u qualityUpdate) (changed bool, err error) {
	for range 10 {
		var cur contract.AccountSignals
		var rev uint64
		e, err := kv.Get(ctx, account)
		switch {
		case err == nil:
			rev = e.Revision()
			if s, derr := contract.DecodeAccountSignals(e.Value()); derr == nil {
				cur = *s
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return false, err
		}
		if !cur.At.IsZero() && cur.At.After(u.At) {
			return false, nil
		}
		next := cur
		if u.Quality != "" {
			next.Quality = u.Quality
		}
		if u.Limit != 0 {
			next.MessagingLimit, next.Tier = u.Limit, u.Tier
		}
		next.Event, next.Source, next.At = u.Event, SourceWhatsApp, u.At
		if next == cur {
			return false, nil
		}
		data, _ := json.Marshal(&next)
		if rev == 0 {
			_, err = kv.Create(ctx, account, data)
		} else {
			_, err = kv.Update(ctx, account, data, rev)
		}
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return false, err
		}
	}
	return false, fmt.Errorf("signals of %s: too many concurrent writers", account)
}

// isWrongSequence reports a compare-and-set that lost to another writer.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// applyQualityUpdates stores the payload's quality updates for the
// accounts signed by signer before the post is answered, so a crash loses
// none (Meta retries an unanswered post). It reports false when it has
// answered the post itself (an error).
func (s *Service) applyQualityUpdates(w http.ResponseWriter, r *http.Request, body, signer []byte) bool {
	updates, err := parseQualityUpdates(body, time.Now().UTC())
	if err != nil {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadRequest, http.StatusBadRequest, err.Error())
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	for _, u := range updates {
		acct := s.accounts.byDisplayPhone(u.DisplayPhone)
		if acct == nil {
			s.log.Warn("WhatsApp quality update ignored: its display_phone_number is no account's", "event", u.Event)
			continue
		}
		if secret, _ := s.accounts.whatsappSecrets(acct); !bytes.Equal(secret, signer) {
			s.log.Warn("WhatsApp quality update ignored: its account has another app secret", "account", acct.Name)
			continue
		}
		changed, err := applySignals(ctx, s.signals, acct.Name, u)
		if err != nil {
			s.log.Warn("storing a quality update failed", "account", acct.Name, "err", err)
			s.refuse(w, routeWhatsApp, metrics.RefusedUnavailable, http.StatusServiceUnavailable, "storing the update failed; try again")
			return false
		}
		if changed {
			s.log.Info("account signals updated", "account", acct.Name, "event", u.Event, "quality", u.Quality, "messaging_limit", u.Limit)
		}
	}
	return true
}
