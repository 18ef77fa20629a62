package feedback

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/internal/metrics"
)

// whatsappPayload is the part of Meta's webhook payload (object
// whatsapp_business_account) feedback reads for receipts: the statuses of
// messages the business sent. Incoming messages are read for stop
// keywords (stop.go) and account-level fields for quality and limits
// (quality.go), each from the raw body.
type whatsappPayload struct {
	Object string `json:"object"`
	Entry  []struct {
		ID      string `json:"id"`
		Changes []struct {
			Field string `json:"field"`
			Value struct {
				Metadata struct {
					PhoneNumberID string `json:"phone_number_id"`
				} `json:"metadata"`
				Statuses []whatsappStatus `json:"statuses"`
			} `json:"value"`
		} `json:"changes"`
	} `json:"entry"`
}

// whatsappStatus is one entry of value.statuses[].
type whatsappStatus struct {
	ID          string          `json:"id"`
	Status      string          `json:"status"`
	Timestamp   string          `json:"timestamp"`
	RecipientID string          `json:"recipient_id"`
	Errors      []whatsappError `json:"errors"`
}

// whatsappError is one entry of a failed status's errors[].
type whatsappError struct {
	Code      int    `json:"code"`
	Title     string `json:"title"`
	Message   string `json:"message"`
	ErrorData struct {
		Details string `json:"details"`
	} `json:"error_data"`
}

// whatsappReceipt is a parsed status with the phone number it was sent from.
type whatsappReceipt struct {
	PhoneNumberID string
	Receipt
}

// maxIDBytes bounds a provider message id (a wamid is about 60 bytes).
const maxIDBytes = 256

// parseWhatsApp reads Meta's payload and returns its statuses delivered,
// read and failed (sent says nothing the send did not; unknown statuses
// are left for later versions), and how many statuses it skipped. An error
// names the field, e.g. entry[0].changes[1].value.statuses[2].id.
func parseWhatsApp(body []byte, received time.Time) (out []whatsappReceipt, skipped int, err error) {
	var p whatsappPayload
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, 0, jsonError("payload", err)
	}
	if p.Object != "whatsapp_business_account" {
		return nil, 0, fmt.Errorf("object: want \"whatsapp_business_account\", got %q", clip(p.Object, 64))
	}
	for i, e := range p.Entry {
		for j, c := range e.Changes {
			if c.Field != "" && c.Field != "messages" {
				continue // account-level webhooks (quality, limits)
			}
			for k, st := range c.Value.Statuses {
				at := fmt.Sprintf("entry[%d].changes[%d].value", i, j)
				if c.Value.Metadata.PhoneNumberID == "" {
					return nil, 0, fmt.Errorf("%s.metadata.phone_number_id: required with statuses", at)
				}
				at = fmt.Sprintf("%s.statuses[%d]", at, k)
				if st.ID == "" || len(st.ID) > maxIDBytes {
					return nil, 0, fmt.Errorf("%s.id: required, at most %d bytes", at, maxIDBytes)
				}
				switch st.Status {
				case StatusDelivered, StatusRead, StatusFailed:
				default:
					skipped++
					continue
				}
				r := whatsappReceipt{PhoneNumberID: c.Value.Metadata.PhoneNumberID, Receipt: Receipt{
					Source: SourceWhatsApp, ID: st.ID, Status: st.Status, At: received, Received: received,
				}}
				// Only a failure may suppress its recipient (131049,
				// 131050), so only failures keep it.
				if id := strings.TrimPrefix(strings.TrimSpace(st.RecipientID), "+"); id != "" && len(id) <= 32 && st.Status == StatusFailed {
					r.To = "+" + id
				}
				if st.Timestamp != "" {
					secs, err := strconv.ParseInt(st.Timestamp, 10, 64)
					if err != nil || secs <= 0 || secs > 1<<40 {
						return nil, 0, fmt.Errorf("%s.timestamp: want Unix seconds, got %q", at, clip(st.Timestamp, 32))
					}
					r.At = time.Unix(secs, 0).UTC()
				}
				if st.Status == StatusFailed && len(st.Errors) > 0 {
					e := st.Errors[0]
					r.Code = strconv.Itoa(e.Code)
					r.Error = clip(joinNonEmpty(": ", e.Title, e.Message, e.ErrorData.Details), maxErrorBytes)
				}
				out = append(out, r)
			}
		}
	}
	return out, skipped, nil
}

// joinNonEmpty joins the non-empty parts that do not repeat the one
// before (Meta's title and message are often the same text).
func joinNonEmpty(sep string, parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" && (len(keep) == 0 || keep[len(keep)-1] != p) {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, sep)
}

// jsonError names the field a JSON decoding error is about.
func jsonError(what string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fmt.Errorf("%s: must be a JSON object, not JSON %s", what, te.Value)
		}
		return fmt.Errorf("%s: must be %s, not JSON %s", te.Field, te.Type, te.Value)
	}
	return fmt.Errorf("%s: not valid JSON: %v", what, err)
}

// checkHubSignature reports whether header (X-Hub-Signature-256 or
// X-Broadcast-Signature: "sha256=<hex>") is the HMAC-SHA256 of body under
// secret, compared in constant time.
func checkHubSignature(header string, body, secret []byte) bool {
	want, ok := parseSignature(header)
	if !ok || len(secret) == 0 {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hmac.Equal(mac.Sum(nil), want)
}

// parseSignature decodes "sha256=<64 hex digits>".
func parseSignature(header string) ([]byte, bool) {
	hexSig, ok := strings.CutPrefix(strings.TrimSpace(header), "sha256=")
	if !ok || len(hexSig) != 2*sha256.Size {
		return nil, false
	}
	sig, err := hex.DecodeString(hexSig)
	return sig, err == nil
}

// whatsappHandshake answers Meta's subscription check: hub.mode=subscribe
// and a hub.verify_token equal to a WhatsApp account's verify token get
// hub.challenge back; anything else 403.
func (s *Service) whatsappHandshake(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("hub.mode") != "subscribe" {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadRequest, http.StatusBadRequest, "hub.mode: want subscribe")
		return
	}
	challenge := q.Get("hub.challenge")
	if challenge == "" || len(challenge) > 256 {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadRequest, http.StatusBadRequest, "hub.challenge: required, at most 256 bytes")
		return
	}
	token := []byte(q.Get("hub.verify_token"))
	matched := false
	for _, acct := range s.accounts.whatsappAccounts() {
		_, verify := s.accounts.whatsappSecrets(acct)
		if len(verify) > 0 && subtle.ConstantTimeCompare(token, verify) == 1 {
			matched = true
		}
	}
	if !matched {
		s.refuse(w, routeWhatsApp, metrics.RefusedUnauthorized, http.StatusForbidden, "hub.verify_token: does not match")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = io.WriteString(w, challenge)
}

// whatsappPost accepts Meta's status webhooks, and opts out the senders
// of inbound replies that are stop keywords (stop.go). The signature is
// checked on the raw body before anything in it is believed: against the app secret
// of every WhatsApp account (accounts of one app share it), and only the
// statuses of phone numbers whose account has the secret that signed are
// kept.
func (s *Service) whatsappPost(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r, routeWhatsApp)
	if !ok {
		return
	}
	header := r.Header.Get("X-Hub-Signature-256")
	if header == "" {
		s.refuse(w, routeWhatsApp, metrics.RefusedUnsigned, http.StatusUnauthorized, "X-Hub-Signature-256: required")
		return
	}
	var signer []byte
	for _, acct := range s.accounts.whatsappAccounts() {
		secret, _ := s.accounts.whatsappSecrets(acct)
		if len(secret) > 0 && checkHubSignature(header, body, secret) {
			signer = secret
			break
		}
	}
	if signer == nil {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadSignature, http.StatusUnauthorized,
			"X-Hub-Signature-256: does not match the app secret of any WhatsApp account")
		return
	}
	parsed, skipped, err := parseWhatsApp(body, time.Now().UTC())
	if err != nil {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	stops, err := parseWhatsAppStops(body, s.cfg.StopKeywords)
	if err != nil {
		s.refuse(w, routeWhatsApp, metrics.RefusedBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.suppressStops(r.Context(), stops, signer); err != nil {
		s.log.Warn("storing an opt-out from a reply failed", "err", err)
		s.refuse(w, routeWhatsApp, metrics.RefusedUnavailable, http.StatusServiceUnavailable, "storing the opt-out failed; try again")
		return
	}
	if !s.applyQualityUpdates(w, r, body, signer) {
		return
	}
	receipts := make([]Receipt, 0, len(parsed))
	var unknown, foreign int
	for _, p := range parsed {
		acct := s.accounts.byPhone(p.PhoneNumberID)
		if acct == nil {
			unknown++
			continue
		}
		if secret, _ := s.accounts.whatsappSecrets(acct); !bytes.Equal(secret, signer) {
			foreign++
			continue
		}
		p.Account = acct.Name
		receipts = append(receipts, p.Receipt)
	}
	if unknown+foreign > 0 {
		skipped += unknown + foreign
		s.log.Warn("WhatsApp statuses ignored: their phone_number_id is no account's, or its account has another app secret",
			"unknown_phone", unknown, "other_app", foreign)
	}
	s.cfg.metrics.Receipt(SourceWhatsApp, metrics.ReceiptIgnored, skipped)
	s.store(w, r, routeWhatsApp, receipts)
}
