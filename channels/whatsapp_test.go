package channels

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

const waToken = "EAAGtestTOKENdoNotLeak123"

// captured is one request a fake provider received.
type captured struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// fakeProvider is an httptest server that records requests and answers
// with reply.
type fakeProvider struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []captured
}

func newFakeProvider(t *testing.T, reply func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeProvider {
	t.Helper()
	f := &fakeProvider{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, captured{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		f.mu.Unlock()
		reply(w, r, body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeProvider) requests() []captured {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]captured(nil), f.reqs...)
}

// answer writes a JSON answer with status.
func answer(status int, body string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func testAccount(t *testing.T, js string) *contract.Account {
	t.Helper()
	acct, err := contract.DecodeAccount("acct-1", []byte(js))
	require.NoError(t, err)
	return acct
}

func envWith(name, value string) func(string) string {
	return func(k string) string {
		if k == name {
			return value
		}
		return ""
	}
}

func requireNoSecret(t *testing.T, rs []Result, secret string) {
	t.Helper()
	for i, r := range rs {
		require.NotContains(t, r.Err, secret, "result %d leaks the secret", i)
	}
}

func waAccount(t *testing.T, endpoint, extra string) *contract.Account {
	js := fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1234567890"%s}`, endpoint, extra)
	return testAccount(t, js)
}

func waSender(t *testing.T, acct *contract.Account) Sender {
	t.Helper()
	s, err := WhatsApp{}.NewSender(acct, envWith("BROADCAST_SECRET_WA", waToken))
	require.NoError(t, err)
	return s
}

const waOK = `{"messaging_product":"whatsapp","contacts":[{"input":"+8613800000001","wa_id":"8613800000001"}],"messages":[{"id":"wamid.HBgNODYxMzgwMDAwMDAwMRUCABEYEjQ2"}]}`

func TestWhatsAppNormalizeRecipient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, region, want, err string
	}{
		{in: "+8613800000001", want: "+8613800000001"},
		{in: "  +86 138-0000-0001 ", want: "+8613800000001"},
		{in: "+1 (650) 253-0000", want: "+16502530000"},
		{in: "+442079460958", want: "+442079460958"},
		{in: "13800000001", err: "not in E.164 (+<country code><number>); set default_region"},
		{in: "13800000001", region: "CN", want: "+8613800000001"},
		{in: "(650) 253-0000", region: "us", want: "+16502530000"},
		{in: "+8613800000001", region: "US", want: "+8613800000001"},
		{in: "+861234", err: "is not a valid phone number"},
		{in: "+86138000000012345", err: "is not a valid phone number"},
		{in: "hello", region: "CN", err: "is not a phone number"},
		{in: "", err: "must not be empty"},
	}
	for _, tt := range tests {
		got, err := NormalizeE164(tt.in, tt.region)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, "input %q region %q", tt.in, tt.region)
			continue
		}
		require.NoError(t, err, "input %q region %q", tt.in, tt.region)
		require.Equal(t, tt.want, got, "input %q region %q", tt.in, tt.region)
	}

	// The channel without an account has no region; with one it uses it.
	_, err := WhatsApp{}.NormalizeRecipient("13800000001")
	require.ErrorContains(t, err, "set default_region")
	got, err := WhatsApp{}.NormalizeRecipientFor(waAccount(t, "", `,"default_region":"CN"`), "138 0000 0001")
	require.NoError(t, err)
	require.Equal(t, "+8613800000001", got)
}

func TestWhatsAppCheckBody(t *testing.T) {
	t.Parallel()
	require.NoError(t, WhatsApp{}.CheckBody(strings.Repeat("字", WhatsAppMaxBody)))
	require.ErrorContains(t, WhatsApp{}.CheckBody(strings.Repeat("字", WhatsAppMaxBody+1)), "is 4097 characters, WhatsApp's limit is 4096")
	require.ErrorContains(t, WhatsApp{}.CheckBody(" \n"), "must not be empty")
}

func TestWhatsAppNewSenderValidation(t *testing.T) {
	t.Parallel()
	env := envWith("BROADCAST_SECRET_WA", waToken)
	tests := []struct{ account, err string }{
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA"}`, "phone_number_id: required"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"12/../34"}`, "phone_number_id: required"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":123}`, "phone_number_id: must be string"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","api_version":"21"}`, "api_version"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","default_region":"XX"}`, "default_region"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","tier":"5k"}`, "tier: unknown WhatsApp tier"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","template":{"name":"x"}}`, "template: name and language are required"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","template":{"name":"x","language":"en","body_params":[""]}}`, "template.body_params[0]"},
		{`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1","endpoint":"ftp://x"}`, "endpoint"},
		{`{"channel":"whatsapp","phone_number_id":"1"}`, "secret_env: required"},
		{`{"channel":"whatsapp","secret_env":"OTHER","phone_number_id":"1"}`, "secret_env: environment variable OTHER is empty or unset"},
	}
	for _, tt := range tests {
		_, err := WhatsApp{}.NewSender(testAccount(t, tt.account), env)
		require.ErrorContains(t, err, tt.err, tt.account)
		require.NotContains(t, err.Error(), waToken)
	}
}

func TestWhatsAppSendText(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(http.StatusOK, waOK))
	s := waSender(t, waAccount(t, fp.URL+"/", `,"api_version":"v22.0"`))

	rs := s.Send(context.Background(), []Message{{ID: "t1.0", TaskID: "t1", To: "+8613800000001", Body: "Hi Li, your code is X-1"}})

	require.Equal(t, []Result{{Code: "200", ProviderID: "wamid.HBgNODYxMzgwMDAwMDAwMRUCABEYEjQ2"}}, rs)
	reqs := fp.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, http.MethodPost, reqs[0].Method)
	require.Equal(t, "/v22.0/1234567890/messages", reqs[0].Path)
	require.Equal(t, "Bearer "+waToken, reqs[0].Header.Get("Authorization"))
	require.Equal(t, "application/json", reqs[0].Header.Get("Content-Type"))
	require.JSONEq(t, `{"messaging_product":"whatsapp","recipient_type":"individual","to":"+8613800000001",
		"type":"text","text":{"body":"Hi Li, your code is X-1"}}`, string(reqs[0].Body))
}

func TestWhatsAppSendDefaultsAndRegion(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(http.StatusOK, waOK))
	s := waSender(t, waAccount(t, fp.URL, `,"default_region":"CN"`))

	rs := s.Send(context.Background(), []Message{{ID: "t1.0", To: "138 0000 0001", Body: "x"}, {ID: "t1.1", To: "12", Body: "x"}})

	require.True(t, rs[0].OK())
	require.Equal(t, contract.ClassPermanent, rs[1].Class)
	require.Equal(t, "recipient", rs[1].Code)
	reqs := fp.requests()
	require.Len(t, reqs, 1, "an invalid number is never posted")
	require.Equal(t, "/"+WhatsAppDefaultVersion+"/1234567890/messages", reqs[0].Path)
	require.JSONEq(t, `{"messaging_product":"whatsapp","recipient_type":"individual","to":"+8613800000001","type":"text","text":{"body":"x"}}`, string(reqs[0].Body))
}

func TestWhatsAppSendTemplate(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(http.StatusOK, waOK))
	s := waSender(t, waAccount(t, fp.URL, `,"template":{"name":"order_update","language":"en_US","body_params":["name","code","points"]}`))

	rs := s.Send(context.Background(), []Message{
		{ID: "t1.0", To: "+8613800000001", Body: "ignored", Vars: map[string]any{"name": "Li", "code": "X-1", "points": float64(1000000)}},
		{ID: "t1.1", To: "+8613800000002", Body: "ignored", Vars: map[string]any{"name": "Wang", "points": 3}},
	})

	require.True(t, rs[0].OK())
	require.Equal(t, contract.ClassPermanent, rs[1].Class)
	require.Equal(t, "template_param", rs[1].Code)
	require.Contains(t, rs[1].Err, `"code" (body_params[1])`)
	reqs := fp.requests()
	require.Len(t, reqs, 1)
	require.JSONEq(t, `{"messaging_product":"whatsapp","recipient_type":"individual","to":"+8613800000001","type":"template",
		"template":{"name":"order_update","language":{"code":"en_US"},"components":[{"type":"body","parameters":[
			{"type":"text","text":"Li"},{"type":"text","text":"X-1"},{"type":"text","text":"1000000"}]}]}}`, string(reqs[0].Body))
}

// graphError is the Graph API's error body.
func graphError(code, subcode int, typ, msg string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "code": code, "error_subcode": subcode,
		"error_data": map[string]any{"messaging_product": "whatsapp", "details": "details of " + msg},
		"fbtrace_id": "AbCdEfGh123",
	}})
	return string(b)
}

func TestWhatsAppErrorClasses(t *testing.T) {
	t.Parallel()
	const oauth = "OAuthException"
	tests := []struct {
		name       string
		status     int
		body       string
		retryAfter string // Retry-After header
		class      contract.ErrorClass
		code       string
		wait       time.Duration
	}{
		{"130429 throughput", 400, graphError(130429, 0, oauth, "(#130429) Rate limit hit"), "", contract.ClassRateLimited, "130429", 0},
		{"130429 with Retry-After", 429, graphError(130429, 0, oauth, "(#130429) Rate limit hit"), "3", contract.ClassRateLimited, "130429", 3 * time.Second},
		{"HTTP 429 without body", 429, "", "7", contract.ClassRateLimited, "429", 7 * time.Second},
		{"4 app call rate", 400, graphError(4, 0, oauth, "(#4) Application request limit reached"), "", contract.ClassRateLimited, "4", 0},
		{"613 call rate", 400, graphError(613, 0, oauth, "(#613) Calls to this api have exceeded the rate limit"), "", contract.ClassRateLimited, "613", 0},
		{"80007 WABA rate", 400, graphError(80007, 0, oauth, "(#80007) Rate limit issues"), "", contract.ClassRateLimited, "80007", 0},
		{"131048 spam rate", 400, graphError(131048, 0, oauth, "(#131048) Spam rate limit hit"), "", contract.ClassRateLimited, "131048", 10 * time.Minute},
		{"131056 pair rate", 400, graphError(131056, 2494055, oauth, "(#131056) (Business Account, Consumer Account) pair rate limit hit"), "", contract.ClassRecipientDelay, "131056", 6 * time.Second},
		{"131049 marketing limit", 400, graphError(131049, 0, oauth, "This message was not delivered to maintain healthy ecosystem engagement."), "", contract.ClassRecipientDelay, "131049", 24 * time.Hour},
		{"131026 undeliverable", 400, graphError(131026, 0, oauth, "Message undeliverable"), "", contract.ClassPermanent, "131026", 0},
		{"131021 recipient is sender", 400, graphError(131021, 0, oauth, "Recipient cannot be sender"), "", contract.ClassPermanent, "131021", 0},
		{"131047 re-engagement", 400, graphError(131047, 0, oauth, "Re-engagement message"), "", contract.ClassPermanent, "131047", 0},
		{"131051 unsupported type", 400, graphError(131051, 0, oauth, "Unsupported message type"), "", contract.ClassPermanent, "131051", 0},
		{"132000 param count", 400, graphError(132000, 0, oauth, "Number of parameters does not match"), "", contract.ClassPermanent, "132000", 0},
		{"132001 template missing", 404, graphError(132001, 0, oauth, "Template name does not exist in the translation"), "", contract.ClassPermanent, "132001", 0},
		{"132015 template paused", 400, graphError(132015, 0, oauth, "Template is paused"), "", contract.ClassPermanent, "132015", 0},
		{"100 invalid parameter", 400, graphError(100, 0, oauth, "(#100) Invalid parameter"), "", contract.ClassPermanent, "100", 0},
		{"100/33 unknown phone number id", 400, graphError(100, 33, "GraphMethodException", "Unsupported post request. Object with ID '1234567890' does not exist"), "", contract.ClassAccountFatal, "100", 0},
		{"190 token expired", 401, graphError(190, 463, oauth, "Error validating access token: Session has expired"), "", contract.ClassAccountFatal, "190", 0},
		{"10 permission denied", 403, graphError(10, 0, oauth, "(#10) Application does not have permission for this action"), "", contract.ClassAccountFatal, "10", 0},
		{"200 permission", 403, graphError(200, 0, oauth, "(#200) Permissions error"), "", contract.ClassAccountFatal, "200", 0},
		{"299 permission", 400, graphError(299, 0, oauth, "(#299) Permission error"), "", contract.ClassAccountFatal, "299", 0},
		{"131031 account locked", 400, graphError(131031, 0, oauth, "Business Account locked"), "", contract.ClassAccountFatal, "131031", 0},
		{"1 unknown API error", 500, graphError(1, 0, oauth, "An unknown error occurred"), "", contract.ClassRetryable, "1", 0},
		{"2 service error", 503, graphError(2, 0, oauth, "Service temporarily unavailable"), "", contract.ClassRetryable, "2", 0},
		{"131000 something went wrong", 500, graphError(131000, 0, oauth, "Something went wrong"), "", contract.ClassRetryable, "131000", 0},
		{"131016 service unavailable", 503, graphError(131016, 0, oauth, "Service unavailable"), "", contract.ClassRetryable, "131016", 0},
		{"HTTP 500 HTML page", 500, "<html>oops</html>", "", contract.ClassRetryable, "500", 0},
		{"unknown code on 4xx", 400, graphError(999999, 0, oauth, "Something new"), "", contract.ClassPermanent, "999999", 0},
		{"unknown code on 5xx", 502, graphError(999999, 0, oauth, "Something new"), "", contract.ClassRetryable, "999999", 0},
		{"unknown code on 401", 401, graphError(999999, 0, oauth, "Something new"), "", contract.ClassAccountFatal, "999999", 0},
		{"token echoed in message", 401, graphError(190, 0, oauth, "Invalid OAuth access token - Cannot parse access token "+waToken), "", contract.ClassAccountFatal, "190", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fp := newFakeProvider(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			rs := waSender(t, waAccount(t, fp.URL, "")).Send(context.Background(), []Message{{ID: "t.0", To: "+8613800000001", Body: "x"}})
			require.Len(t, rs, 1)
			require.Equal(t, tt.class, rs[0].Class)
			require.Equal(t, tt.code, rs[0].Code)
			require.Equal(t, tt.wait, rs[0].RetryAfter)
			require.Empty(t, rs[0].ProviderID)
			require.NotEmpty(t, rs[0].Err)
			requireNoSecret(t, rs, waToken)
			if strings.HasPrefix(tt.body, "{") {
				require.Contains(t, rs[0].Err, "fbtrace_id AbCdEfGh123")
			}
		})
	}
}

func TestWhatsAppBatchStopsOnAccountAnswers(t *testing.T) {
	t.Parallel()
	msgs := []Message{{ID: "t.0", To: "+8613800000001", Body: "x"}, {ID: "t.1", To: "+8613800000002", Body: "x"}, {ID: "t.2", To: "+8613800000003", Body: "x"}}

	fatal := newFakeProvider(t, answer(401, graphError(190, 0, "OAuthException", "Error validating access token")))
	rs := waSender(t, waAccount(t, fatal.URL, "")).Send(context.Background(), msgs)
	require.Len(t, rs, 3)
	for _, r := range rs {
		require.Equal(t, contract.ClassAccountFatal, r.Class)
	}
	require.Len(t, fatal.requests(), 1, "a revoked token is not tried again within the batch")

	// A per-recipient answer does not stop the others.
	pair := newFakeProvider(t, answer(400, graphError(131056, 0, "OAuthException", "pair rate limit hit")))
	rs = waSender(t, waAccount(t, pair.URL, "")).Send(context.Background(), msgs)
	require.Len(t, pair.requests(), 3)
	for _, r := range rs {
		require.Equal(t, contract.ClassRecipientDelay, r.Class)
	}
}

func TestWhatsAppNetworkError(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(200, waOK))
	url := fp.URL
	fp.Close()
	rs := waSender(t, waAccount(t, url, "")).Send(context.Background(), []Message{{ID: "t.0", To: "+8613800000001", Body: "x"}})
	require.Equal(t, contract.ClassRetryable, rs[0].Class)
	require.Equal(t, "network", rs[0].Code)
	requireNoSecret(t, rs, waToken)
}

func TestWhatsAppTierCap(t *testing.T) {
	t.Parallel()
	for tier, want := range map[string]int{"250": 250, "1k": 1000, "2k": 2000, "10K": 10000, "100k": 100000, "unlimited": 0} {
		got, err := WhatsAppTierCap(tier)
		require.NoError(t, err, tier)
		require.Equal(t, want, got, tier)
	}
	_, err := WhatsAppTierCap("")
	require.Error(t, err)
	_, err = WhatsAppTierCap("1000")
	require.ErrorContains(t, err, "want 250, 1k, 2k, 10k, 100k or unlimited")
}

func TestBuiltinHasProviderChannels(t *testing.T) {
	t.Parallel()
	r := Builtin()
	for _, name := range []string{"whatsapp", "wxpusher", "smtp"} {
		c, err := r.Get(name)
		require.NoError(t, err)
		require.Equal(t, name, c.Name())
	}
}

// FuzzNormalizeE164 checks that the canonical form is stable: render uses
// it for duplicate detection, so normalising it again must not change it.
func FuzzNormalizeE164(f *testing.F) {
	for _, s := range []string{"+8613800000001", "13800000001", "+1 (650) 253-0000", "00861380000", "+", "１３８", "+86 138 0000 0001 ext. 5"} {
		f.Add(s, "")
		f.Add(s, "CN")
	}
	f.Fuzz(func(t *testing.T, in, region string) {
		out, err := NormalizeE164(in, region)
		if err != nil {
			return
		}
		require.True(t, strings.HasPrefix(out, "+"), out)
		again, err := NormalizeE164(out, "")
		require.NoError(t, err)
		require.Equal(t, out, again)
	})
}
