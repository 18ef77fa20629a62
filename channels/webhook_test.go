package channels

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestWebhookErrorClipped: a gateway's long error answer is cut like every
// adapter's (clip), on a character boundary, with the signing secret it
// echoes redacted first.
func TestWebhookErrorClipped(t *testing.T) {
	t.Parallel()
	const signing = "hook-signing-secret"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		// "HTTP 500: é!" is 13 bytes: byte 300 falls inside a character.
		_, _ = w.Write([]byte("é!" + strings.Repeat("出错了", 200) + signing))
	}))
	t.Cleanup(srv.Close)
	s, err := Webhook{}.NewSender(testAccount(t, `{"channel":"webhook","endpoint":"`+srv.URL+`","secret_env":"BROADCAST_SECRET_HOOK"}`), envWith("BROADCAST_SECRET_HOOK", signing))
	require.NoError(t, err)
	r := s.Send(context.Background(), []Message{{ID: "t.0", TaskID: "t", To: "a", Body: "hi"}})[0]
	require.Equal(t, contract.ClassRetryable, r.Class)
	require.Equal(t, "500", r.Code)
	require.True(t, utf8.ValidString(r.Err), "%q", r.Err)
	require.True(t, strings.HasPrefix(r.Err, "HTTP 500: é!出错了"), r.Err)
	require.True(t, strings.HasSuffix(r.Err, "..."), r.Err)
	require.LessOrEqual(t, len(r.Err), maxErrLen+len("..."))
	require.NotContains(t, r.Err, signing[:8])
}

// TestWebhookSecretEnv: a named signing secret must be set; none means
// unsigned requests.
func TestWebhookSecretEnv(t *testing.T) {
	t.Parallel()
	_, err := Webhook{}.NewSender(testAccount(t, `{"channel":"webhook","endpoint":"http://gw.example","secret_env":"BROADCAST_SECRET_HOOK"}`), envWith("", ""))
	require.ErrorContains(t, err, "secret_env: environment variable BROADCAST_SECRET_HOOK is empty or unset")
	s, err := Webhook{}.NewSender(testAccount(t, `{"channel":"webhook","endpoint":"http://gw.example"}`), envWith("", ""))
	require.NoError(t, err)
	require.Empty(t, s.(*webhookSender).secret)
	_, err = Webhook{}.NewSender(testAccount(t, `{"channel":"webhook","endpoint":"http://gw.example","timeout":"soon"}`), envWith("", ""))
	require.ErrorContains(t, err, "invalid duration")
}
