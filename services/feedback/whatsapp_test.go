package feedback

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/feedbacktest"
)

func TestCheckHubSignature(t *testing.T) {
	t.Parallel()
	body := []byte(`{"object":"whatsapp_business_account"}`)
	secret := []byte("app-secret")
	good := feedbacktest.Sign(secret, body)
	require.True(t, checkHubSignature(good, body, secret))
	require.True(t, checkHubSignature(" "+good+" ", body, secret), "surrounding spaces are trimmed")
	for name, header := range map[string]string{
		"empty":          "",
		"no prefix":      strings.TrimPrefix(good, "sha256="),
		"sha1":           "sha1=" + strings.TrimPrefix(good, "sha256="),
		"short":          good[:len(good)-2],
		"not hex":        "sha256=" + strings.Repeat("zz", 32),
		"other secret":   feedbacktest.Sign([]byte("other"), body),
		"other body":     feedbacktest.Sign(secret, append(body, ' ')),
		"upper-case hex": "sha256=" + strings.ToUpper(strings.TrimPrefix(good, "sha256=")) + "0",
	} {
		require.False(t, checkHubSignature(header, body, secret), name)
	}
	require.False(t, checkHubSignature(good, body, nil), "no secret never matches")
}

func TestParseWhatsApp(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_750_000_000, 0).UTC()
	now := time.Now().UTC()
	body := feedbacktest.WhatsAppPayload("106540352242922",
		feedbacktest.WhatsAppStatus{ID: "wamid.A=", Status: "sent", RecipientID: "16505551234", At: at},
		feedbacktest.WhatsAppStatus{ID: "wamid.A=", Status: "delivered", RecipientID: "16505551234", At: at},
		feedbacktest.WhatsAppStatus{ID: "wamid.B+", Status: "read", At: at},
		feedbacktest.WhatsAppStatus{ID: "wamid.C", Status: "failed", Code: 131026, Title: "Message undeliverable",
			Details: "Unable to deliver message.", At: at},
		feedbacktest.WhatsAppStatus{ID: "wamid.D", Status: "deleted", At: at},
	)
	got, skipped, err := parseWhatsApp(body, now)
	require.NoError(t, err)
	require.Equal(t, 2, skipped, "sent and an unknown status are skipped")
	require.Len(t, got, 3)
	require.Equal(t, whatsappReceipt{PhoneNumberID: "106540352242922", Receipt: Receipt{Source: SourceWhatsApp, ID: "wamid.A=",
		Status: StatusDelivered, At: at, Received: now}}, got[0])
	require.Equal(t, StatusRead, got[1].Status)
	require.Equal(t, "wamid.B+", got[1].ID)
	require.Equal(t, StatusFailed, got[2].Status)
	require.Equal(t, "131026", got[2].Code)
	require.Equal(t, "Message undeliverable: Unable to deliver message.", got[2].Error, "title and message are not repeated")

	// Account-level webhooks and incoming messages carry no statuses.
	quality := `{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"phone_number_quality_update",
		"value":{"display_phone_number":"15550783881","event":"FLAGGED","current_limit":"TIER_10K"}}]}]}`
	got, skipped, err = parseWhatsApp([]byte(quality), now)
	require.NoError(t, err)
	require.Empty(t, got)
	require.Zero(t, skipped)
}

func TestParseWhatsAppNamesTheField(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`not json`:          "payload: not valid JSON",
		`{"object":"page"}`: "object: want",
		`{"object":"whatsapp_business_account","entry":{}}`: "entry: must be",
		`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"statuses":[{"id":"x","status":"read"}]}}]}]}`:                                             "entry[0].changes[0].value.metadata.phone_number_id: required",
		`{"object":"whatsapp_business_account","entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"1"},"statuses":[{"status":"read"}]}}]}]}`:                                      "entry[0].changes[0].value.statuses[0].id: required",
		`{"object":"whatsapp_business_account","entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"1"},"statuses":[{"id":"x","status":"read","timestamp":"soon"}]}}]}]}`:          "entry[0].changes[0].value.statuses[0].timestamp: want Unix seconds",
		`{"object":"whatsapp_business_account","entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"1"},"statuses":[{"id":"x","status":"failed","errors":[{"code":"big"}]}]}}]}]}`: "entry.changes.value.statuses.errors.code: must be int",
	} {
		_, _, err := parseWhatsApp([]byte(body), time.Now())
		require.ErrorContains(t, err, want, body)
	}
}

// FuzzParseWhatsApp: no input crashes the parser, and every status it
// keeps has an id within bounds and a known status.
func FuzzParseWhatsApp(f *testing.F) {
	f.Add(feedbacktest.WhatsAppPayload("1", feedbacktest.WhatsAppStatus{ID: "wamid.A", Status: "failed", Code: 131049, Title: "x"}))
	f.Add([]byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"1"},"statuses":[{"id":"x","status":"read","timestamp":"1"}]}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, _, err := parseWhatsApp(body, time.Now())
		if err != nil {
			return
		}
		for _, r := range got {
			if r.ID == "" || len(r.ID) > maxIDBytes || len(r.Error) > maxErrorBytes {
				t.Fatalf("kept a bad status: %+v", r)
			}
			switch r.Status {
			case StatusDelivered, StatusRead, StatusFailed:
			default:
				t.Fatalf("kept status %q", r.Status)
			}
		}
	})
}
