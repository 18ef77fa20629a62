// Package feedbacktest is a stand-in for the providers that post receipts
// to services/feedback: it builds Meta's status payloads and the webhook
// channel's receipts, signs them as the providers do, and posts them the
// way providers do, again and again until they get an answer.
package feedbacktest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Sign is the signature header value of body under secret:
// "sha256=<hex HMAC-SHA256>", as Meta puts it in X-Hub-Signature-256 and
// Broadcast in X-Broadcast-Signature.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// WhatsAppStatus is one entry of a Meta status webhook.
type WhatsAppStatus struct {
	// ID is the wamid; Status is sent, delivered, read or failed.
	ID, Status string
	// RecipientID is the user's WhatsApp id (digits).
	RecipientID string
	// Code, Title and Details describe a failure.
	Code           int
	Title, Details string
	At             time.Time
}

// WhatsAppPayload is Meta's webhook payload for statuses of messages sent
// from phoneNumberID, in the shape of the Cloud API's messages webhook.
func WhatsAppPayload(phoneNumberID string, statuses ...WhatsAppStatus) []byte {
	type errData struct {
		Details string `json:"details"`
	}
	type waErr struct {
		Code      int     `json:"code"`
		Title     string  `json:"title"`
		Message   string  `json:"message"`
		ErrorData errData `json:"error_data"`
		Href      string  `json:"href"`
	}
	var sts []map[string]any
	for _, s := range statuses {
		at := s.At
		if at.IsZero() {
			at = time.Now()
		}
		st := map[string]any{
			"id": s.ID, "status": s.Status, "timestamp": strconv.FormatInt(at.Unix(), 10), "recipient_id": s.RecipientID,
			"conversation": map[string]any{"id": "c-" + s.ID, "origin": map[string]string{"type": "marketing"}},
			"pricing":      map[string]any{"billable": true, "pricing_model": "PMP", "category": "marketing"},
		}
		if s.Status == "failed" {
			st["errors"] = []waErr{{Code: s.Code, Title: s.Title, Message: s.Title, ErrorData: errData{Details: s.Details},
				Href: "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"}}
		}
		sts = append(sts, st)
	}
	body, _ := json.Marshal(map[string]any{
		"object": "whatsapp_business_account",
		"entry": []any{map[string]any{
			"id": "102290129340398",
			"changes": []any{map[string]any{
				"field": "messages",
				"value": map[string]any{
					"messaging_product": "whatsapp",
					"metadata":          map[string]string{"display_phone_number": "15550783881", "phone_number_id": phoneNumberID},
					"statuses":          sts,
				},
			}},
		}},
	})
	return body
}

// WhatsAppQualityUpdate is one phone_number_quality_update of Meta's
// account webhooks: the number, the event (FLAGGED, UNFLAGGED, DOWNGRADE,
// UPGRADE, ...), the limits as tier names (TIER_250, TIER_2K, ...; empty
// left out) and the entry's time.
type WhatsAppQualityUpdate struct {
	DisplayPhoneNumber, Event, CurrentLimit, OldLimit, MaxDailyPerBusiness string
	At                                                                     time.Time
}

// WhatsAppQualityPayload is Meta's payload for account-level quality
// updates, in the shape of the phone_number_quality_update webhook
// reference.
func WhatsAppQualityPayload(updates ...WhatsAppQualityUpdate) []byte {
	var entries []any
	for _, u := range updates {
		at := u.At
		if at.IsZero() {
			at = time.Now()
		}
		value := map[string]string{"display_phone_number": u.DisplayPhoneNumber, "event": u.Event}
		for k, v := range map[string]string{"current_limit": u.CurrentLimit, "old_limit": u.OldLimit,
			"max_daily_conversations_per_business": u.MaxDailyPerBusiness} {
			if v != "" {
				value[k] = v
			}
		}
		entries = append(entries, map[string]any{
			"id": "102290129340398", "time": at.Unix(),
			"changes": []any{map[string]any{"field": "phone_number_quality_update", "value": value}},
		})
	}
	body, _ := json.Marshal(map[string]any{"object": "whatsapp_business_account", "entry": entries})
	return body
}

// WebhookReceipt is the webhook channel's receipt body.
func WebhookReceipt(id, status, code, reason string, at time.Time) []byte {
	body, _ := json.Marshal(map[string]string{"id": id, "status": status, "code": code, "error": reason, "at": at.UTC().Format(time.RFC3339Nano)})
	return body
}

// Poster posts like a provider: a request that fails or gets no answer
// (or a 5xx) is posted again after a short pause until it gets a 2xx or
// 4xx answer or ctx ends.
type Poster struct {
	// BaseURL is feedback's, e.g. http://127.0.0.1:8090.
	BaseURL string
	// Client defaults to one with a 5 s timeout.
	Client *http.Client
	// Retry is the pause between tries. Defaults to 50 ms.
	Retry time.Duration
}

// Post posts body to path with headers and returns the final status and
// how many tries it took.
func (p *Poster) Post(ctx context.Context, path string, headers map[string]string, body []byte) (status, tries int, err error) {
	client := p.Client
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	retry := p.Retry
	if retry == 0 {
		retry = 50 * time.Millisecond
	}
	for {
		tries++
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.BaseURL+path, bytes.NewReader(body))
		if err != nil {
			return 0, tries, err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return resp.StatusCode, tries, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, tries, fmt.Errorf("gave up after %d tries: %w", tries, ctx.Err())
		case <-time.After(retry):
		}
	}
}
