package feedback

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
)

// webhookReceipt is the body of POST /webhooks/receipts (DESIGN.md
// section 4): the gateway's report on a message it accepted, keyed by the
// Idempotency-Key dispatch sent it.
type webhookReceipt struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Code   string `json:"code"`
	Error  string `json:"error"`
	At     string `json:"at"`
}

// parseWebhookReceipt validates a receipt body; errors name the field.
func parseWebhookReceipt(body []byte, account string, received time.Time) (Receipt, error) {
	var b webhookReceipt
	if err := json.Unmarshal(body, &b); err != nil {
		return Receipt{}, jsonError("body", err)
	}
	if b.ID == "" || len(b.ID) > maxIDBytes {
		return Receipt{}, fmt.Errorf("id: required (the Idempotency-Key of the send), at most %d bytes", maxIDBytes)
	}
	switch b.Status {
	case StatusDelivered, StatusRead, StatusFailed:
	default:
		return Receipt{}, fmt.Errorf("status: want delivered, read or failed, got %q", clip(b.Status, 32))
	}
	r := Receipt{Source: SourceWebhook, Account: account, ID: b.ID, Status: b.Status, At: received, Received: received,
		Code: clip(b.Code, 64), Error: clip(b.Error, maxErrorBytes)}
	if b.At != "" {
		at, err := time.Parse(time.RFC3339Nano, b.At)
		if err != nil {
			return Receipt{}, fmt.Errorf("at: want RFC 3339, got %q", clip(b.At, 40))
		}
		r.At = at.UTC()
	}
	return r, nil
}

// receiptsPost accepts a webhook gateway's receipt: X-Broadcast-Account
// names a webhook account, whose secret (secret_env, the one dispatch signs
// its requests with) must have signed the raw body in
// X-Broadcast-Signature. An account without a secret cannot post receipts.
func (s *Service) receiptsPost(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r, routeReceipts)
	if !ok {
		return
	}
	header := r.Header.Get("X-Broadcast-Signature")
	if header == "" {
		s.refuse(w, routeReceipts, metrics.RefusedUnsigned, http.StatusUnauthorized, "X-Broadcast-Signature: required")
		return
	}
	name := strings.TrimSpace(r.Header.Get("X-Broadcast-Account"))
	acct := s.accounts.aw.Get(name)
	if !contract.ValidID(name) || acct == nil || acct.Channel != "webhook" {
		s.refuse(w, routeReceipts, metrics.RefusedBadSignature, http.StatusUnauthorized,
			"X-Broadcast-Account: not a webhook account")
		return
	}
	secret, err := s.accounts.secret("secret_env", acct.SecretEnv)
	if err != nil {
		if !errors.Is(err, errNoSecret) {
			s.log.Warn("webhook account's secret cannot be read", "account", name, "err", err)
		}
		s.refuse(w, routeReceipts, metrics.RefusedBadSignature, http.StatusUnauthorized,
			"X-Broadcast-Signature: the account has no secret to check it with")
		return
	}
	if !checkHubSignature(header, body, secret) {
		s.refuse(w, routeReceipts, metrics.RefusedBadSignature, http.StatusUnauthorized, "X-Broadcast-Signature: does not match")
		return
	}
	rc, err := parseWebhookReceipt(body, name, time.Now().UTC())
	if err != nil {
		s.refuse(w, routeReceipts, metrics.RefusedBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	s.store(w, r, routeReceipts, []Receipt{rc})
}
