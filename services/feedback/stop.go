package feedback

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// DefaultStopKeywords are the inbound replies that opt a WhatsApp user out
// unless Config.StopKeywords says otherwise.
var DefaultStopKeywords = []string{"STOP", "UNSUBSCRIBE", "退订", "TD"}

// SourceWhatsAppReply is the source of suppression entries added from a
// user's STOP-style reply.
const SourceWhatsAppReply = "whatsapp"

// whatsappInbound is the part of Meta's payload with the users' messages
// to the business (value.messages[]).
type whatsappInbound struct {
	Entry []struct {
		Changes []struct {
			Field string `json:"field"`
			Value struct {
				Metadata struct {
					PhoneNumberID string `json:"phone_number_id"`
				} `json:"metadata"`
				Messages []struct {
					From string `json:"from"`
					Type string `json:"type"`
					Text struct {
						Body string `json:"body"`
					} `json:"text"`
				} `json:"messages"`
			} `json:"value"`
		} `json:"changes"`
	} `json:"entry"`
}

// whatsappStop is an inbound reply that is a stop keyword: the sender and
// the business phone number it wrote to.
type whatsappStop struct {
	PhoneNumberID string
	From          string
}

// parseWhatsAppStops returns the text messages whose body, trimmed, equals
// one of keywords (case-insensitive). Other messages are ignored.
func parseWhatsAppStops(body []byte, keywords []string) ([]whatsappStop, error) {
	if len(keywords) == 0 || !bytes.Contains(body, []byte(`"messages"`)) {
		return nil, nil
	}
	var p whatsappInbound
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, jsonError("payload", err)
	}
	var out []whatsappStop
	for i, e := range p.Entry {
		for j, c := range e.Changes {
			if c.Field != "" && c.Field != "messages" {
				continue
			}
			for k, m := range c.Value.Messages {
				if m.Type != "text" || !isStopKeyword(m.Text.Body, keywords) {
					continue
				}
				at := fmt.Sprintf("entry[%d].changes[%d].value", i, j)
				if c.Value.Metadata.PhoneNumberID == "" {
					return nil, fmt.Errorf("%s.metadata.phone_number_id: required with messages", at)
				}
				from := strings.TrimPrefix(strings.TrimSpace(m.From), "+")
				if from == "" || len(from) > 32 {
					return nil, fmt.Errorf("%s.messages[%d].from: required, at most 32 digits", at, k)
				}
				out = append(out, whatsappStop{PhoneNumberID: c.Value.Metadata.PhoneNumberID, From: "+" + from})
			}
		}
	}
	return out, nil
}

// isStopKeyword reports whether body, trimmed, is one of keywords, in any
// letter case.
func isStopKeyword(body string, keywords []string) bool {
	body = strings.TrimSpace(body)
	if len(body) > 64 {
		return false
	}
	for _, k := range keywords {
		if strings.EqualFold(body, k) {
			return true
		}
	}
	return false
}

// suppressStops adds the senders of stop replies to the suppression list:
// scope whatsapp, reason opt_out, every category, source whatsapp. Only
// replies to phone numbers of accounts whose app secret signed the payload
// count (signer), as for statuses. A sender that does not normalize is
// logged without its number and skipped; a failed write is returned, so
// the webhook answers 503 and Meta delivers it again.
func (s *Service) suppressStops(ctx context.Context, stops []whatsappStop, signer []byte) error {
	for _, st := range stops {
		acct := s.accounts.byPhone(st.PhoneNumberID)
		if acct == nil {
			continue
		}
		if secret, _ := s.accounts.whatsappSecrets(acct); !bytes.Equal(secret, signer) {
			continue
		}
		e := contract.Suppression{To: st.From, Reason: contract.ReasonOptOut, Source: SourceWhatsAppReply, At: time.Now().UTC()}
		probe := e
		if _, err := suppress.Prepare(scopeWhatsApp, &probe); err != nil {
			s.log.Warn("a stop reply's sender does not normalize; not suppressed", shared.KeyAccount, acct.Name)
			continue
		}
		key, err := s.suppressions.Merge(ctx, scopeWhatsApp, e)
		if err != nil {
			return fmt.Errorf("suppression entry: %w", err)
		}
		s.log.Info("recipient opted out by reply", shared.KeyAccount, acct.Name, "key", key)
	}
	return nil
}
