package feedback

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
)

func TestParseWebhookReceipt(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	r, err := parseWebhookReceipt(feedbacktest.WebhookReceipt("promo.7", "failed", "550", "mailbox full", at), "hook-a", now)
	require.NoError(t, err)
	require.Equal(t, Receipt{Source: SourceWebhook, Account: "hook-a", ID: "promo.7", Status: StatusFailed, Code: "550",
		Error: "mailbox full", At: at, Received: now}, r)
	r, err = parseWebhookReceipt([]byte(`{"id":"promo.7","status":"read"}`), "hook-a", now)
	require.NoError(t, err)
	require.Equal(t, now, r.At, "without at, the time it was received")

	for body, want := range map[string]string{
		`[]`:                                    "body: must be",
		`{"status":"read"}`:                     "id: required",
		`{"id":"x","status":"bounced"}`:         `status: want delivered, read or failed, got "bounced"`,
		`{"id":"x","status":"read","at":"now"}`: "at: want RFC 3339",
		`{"id":1,"status":"read"}`:              "id: must be string",
		`{"id":"` + strings.Repeat("x", 300) + `","status":"read"}`: "id: required (the Idempotency-Key of the send), at most 256 bytes",
	} {
		_, err := parseWebhookReceipt([]byte(body), "a", now)
		require.ErrorContains(t, err, want, body)
	}
}

func TestParseBounce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	r, err := parseBounce([]byte(`{"email":" Li@Example.COM ","type":"hard","reason":"550 5.1.1 user unknown"}`), now)
	require.NoError(t, err)
	require.Equal(t, Receipt{Source: SourceBounce, Email: "li@example.com", Status: BounceHard, Code: BounceHard,
		Error: "550 5.1.1 user unknown", At: now, Received: now}, r)
	for body, want := range map[string]string{
		`{"type":"hard"}`:                          "email: required",
		`{"email":"nobody","type":"hard"}`:         "email: required",
		`{"email":"a@b","type":"maybe"}`:           `type: want hard, soft or complaint, got "maybe"`,
		`{"email":"a@b","type":"soft","reason":3}`: "reason: must be string",
	} {
		_, err := parseBounce([]byte(body), now)
		require.ErrorContains(t, err, want, body)
	}
}

func TestBearerToken(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{Token: "s3cret"}}
	require.True(t, s.bearerOK("Bearer s3cret"))
	for _, h := range []string{"", "s3cret", "Bearer ", "Bearer s3cret ", "bearer s3cret", "Bearer s3cre", "Basic s3cret"} {
		require.False(t, s.bearerOK(h), "%q", h)
	}
	require.False(t, (&Service{}).bearerOK("Bearer "), "no token configured refuses even an empty one")
}

func TestIndexKeysAndEventKinds(t *testing.T) {
	t.Parallel()
	ev := &contract.Event{TaskID: "t", JobID: "t.3", Account: "a", Kind: contract.EventSent, ProviderID: "wamid.X=", To: "Li@Example.com"}
	require.Equal(t, []string{idKey("a", "wamid.X=")}, indexKeys(ev, "whatsapp"))
	require.Equal(t, []string{idKey("a", "wamid.X="), idKey("a", "t.3")}, indexKeys(ev, "webhook"))
	require.Equal(t, []string{idKey("a", "wamid.X="), emailKey("li@example.com")}, indexKeys(ev, "smtp"))
	require.NotEqual(t, idKey("a", "x"), idKey("b", "x"), "keys are per account")
	for _, k := range append(indexKeys(ev, "webhook"), emailKey("x@y")) {
		require.Regexp(t, `^[-/_=.a-zA-Z0-9]+$`, k, "a valid KV key")
	}
	for status, want := range map[string]contract.EventKind{
		StatusDelivered: contract.EventDelivered, StatusRead: contract.EventRead, StatusFailed: contract.EventUndelivered,
		BounceHard: contract.EventUndelivered, BounceComplaint: contract.EventDelivered,
	} {
		got, _, ok := eventKind(&Receipt{Status: status})
		require.True(t, ok, status)
		require.Equal(t, want, got, status)
	}
	for _, status := range []string{StatusSent, BounceSoft, "other"} {
		_, _, ok := eventKind(&Receipt{Status: status})
		require.False(t, ok, status)
	}
}
