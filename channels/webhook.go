package channels

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// Webhook posts each message to the account's endpoint, as the contract's
// webhook protocol describes. The recipient is opaque to it. Its signing
// secret is never sent (only the signature), so plain http is allowed.
type Webhook struct {
	// Net is where its requests may go. Defaults to anywhere.
	Net NetPolicy
}

// Name implements Channel.
func (Webhook) Name() string { return "webhook" }

// NormalizeRecipient trims spaces; any non-empty string up to 256 bytes goes.
func (Webhook) NormalizeRecipient(to string) (string, error) {
	to = strings.TrimSpace(to)
	if to == "" {
		return "", errors.New("must not be empty")
	}
	if len(to) > contract.MaxRecipientBytes {
		return "", fmt.Errorf("is %d bytes, limit is %d", len(to), contract.MaxRecipientBytes)
	}
	return to, nil
}

// CheckBody accepts any body within the global limit.
func (Webhook) CheckBody(string) error { return nil }

// webhookOptions are the webhook-specific account fields.
type webhookOptions struct {
	// Timeout per request. Defaults to 10s.
	Timeout contract.Duration `json:"timeout"`
}

// NewSender implements Channel.
func (w Webhook) NewSender(acct *contract.Account, getenv func(string) string) (Sender, error) {
	if acct.Endpoint == "" {
		return nil, errors.New("endpoint: required for webhook accounts")
	}
	if _, err := baseURL(acct.Endpoint, "", false); err != nil {
		return nil, err
	}
	var o webhookOptions
	if err := decodeOptions(acct, &o); err != nil {
		return nil, err
	}
	signing, err := secret(acct, getenv, false)
	if err != nil {
		return nil, err
	}
	s := &webhookSender{
		account:  acct.Name,
		endpoint: acct.Endpoint,
		hidden:   queryValues(acct.Endpoint),
		client:   newHTTPClient(acct, requestTimeout(o.Timeout, 10*time.Second), w.Net),
	}
	if signing != "" {
		s.secret = []byte(signing)
		s.hidden = append(s.hidden, signing)
	}
	return s, nil
}

type webhookSender struct {
	account  string
	endpoint string
	secret   []byte
	// hidden is what never appears in a result: the secret and the
	// endpoint's query values (a token in "?token=...").
	hidden []string
	client *http.Client
}

// webhookBody is the JSON posted to the gateway.
type webhookBody struct {
	ID      string `json:"id"`
	TaskID  string `json:"task_id"`
	To      string `json:"to"`
	Body    string `json:"body"`
	Account string `json:"account"`
	Attempt int    `json:"attempt"`
}

// Send posts each message in turn (webhook accounts are not batched).
func (s *webhookSender) Send(ctx context.Context, msgs []Message) []Result {
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		out[i] = s.sendOne(ctx, m)
	}
	return out
}

// Sign returns the X-Broadcast-Signature value for body under secret.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func (s *webhookSender) sendOne(ctx context.Context, m Message) Result {
	payload, err := json.Marshal(webhookBody{ID: m.ID, TaskID: m.TaskID, To: m.To, Body: m.Body, Account: s.account, Attempt: m.Attempt})
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "encode", Err: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, bytes.NewReader(payload))
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "request", Err: clip(redact(errorText(err), s.hidden...))}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", m.ID)
	if len(s.secret) > 0 {
		req.Header.Set("X-Broadcast-Signature", Sign(s.secret, payload))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// url.Error repeats the endpoint, whose query may hold a token:
		// networkResult redacts it.
		return networkResult(err, s.hidden...)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return Result{Class: contract.ClassPermanent, Code: strconv.Itoa(resp.StatusCode), Err: redirected(resp)}
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	class := ClassifyHTTP(resp.StatusCode)
	r := Result{Class: class, Code: strconv.Itoa(resp.StatusCode)}
	if class == "" {
		r.ProviderID = providerID(answer)
		return r
	}
	// A gateway that echoes the signing secret must not leak it into the
	// result (redacted before clipping, so no prefix of it survives).
	r.Err = clip(redact(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(answer))), s.hidden...))
	if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		r.RetryAfter = d
	}
	return r
}

// providerID picks a message id out of a gateway's JSON answer, if any.
func providerID(answer []byte) string {
	var v struct {
		ID        string `json:"id"`
		MessageID string `json:"message_id"`
	}
	if json.Unmarshal(answer, &v) != nil {
		return ""
	}
	if v.MessageID != "" {
		return v.MessageID
	}
	return v.ID
}
