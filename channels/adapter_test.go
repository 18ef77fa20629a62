package channels

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestTokenChannelsRequireHTTPS: WhatsApp and WxPusher send their token
// with every request, so their endpoint must be https unless it is a
// loopback host; SMTP with a username must not authenticate in plain text
// to another host. The webhook's secret only signs, so http stays allowed.
func TestTokenChannelsRequireHTTPS(t *testing.T) {
	t.Parallel()
	wa := func(endpoint string) error {
		_, err := WhatsApp{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"whatsapp","endpoint":%q,"secret_env":"BROADCAST_SECRET_WA","phone_number_id":"1"}`, endpoint)), envWith("BROADCAST_SECRET_WA", "tok"))
		return err
	}
	wx := func(endpoint string) error {
		_, err := WxPusher{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"wxpusher","endpoint":%q,"secret_env":"BROADCAST_SECRET_WX"}`, endpoint)), envWith("BROADCAST_SECRET_WX", "AT_x"))
		return err
	}
	hook := func(endpoint string) error {
		_, err := Webhook{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, endpoint)), envWith("", ""))
		return err
	}
	for _, endpoint := range []string{"http://graph.example.com", "http://10.0.0.5:8080/x", "http://127.0.0.1.example.com"} {
		require.ErrorContains(t, wa(endpoint), "endpoint: \""+endpoint+"\" must use https: this channel sends its token with every request", endpoint)
		require.ErrorContains(t, wx(endpoint), "must use https", endpoint)
		require.NoError(t, hook(endpoint), "webhook over http: %s", endpoint)
	}
	for _, endpoint := range []string{"https://graph.example.com", "http://127.0.0.1:9000", "http://127.8.9.1", "http://localhost:1234", "http://[::1]:80", "http://api.localhost"} {
		require.NoError(t, wa(endpoint), endpoint)
		require.NoError(t, wx(endpoint), endpoint)
	}
	require.ErrorContains(t, wa("http://graph.example.com/?access_token=SECRET"), `"http://graph.example.com/?[redacted]"`, "the error hides the query")

	smtp := func(host, tls string) error {
		_, err := SMTP{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"smtp","host":%q,"tls":%q,"from":"a@b.c","username":"u","secret_env":"BROADCAST_SECRET_SMTP"}`, host, tls)), envWith("BROADCAST_SECRET_SMTP", "pw"))
		return err
	}
	require.ErrorContains(t, smtp("smtp.example.com", "none"), `tls: "none" would send the password for "u" in plain text to smtp.example.com`)
	require.NoError(t, smtp("127.0.0.1", "none"))
	require.NoError(t, smtp("smtp.example.com", "starttls"))
}

// TestRedirectsNotFollowed: a 307 would re-send the body, tokens included,
// to the host it names. Every HTTP adapter takes it as the answer instead:
// permanent, naming the target's host but not its path or query, and the
// target never sees a request.
func TestRedirectsNotFollowed(t *testing.T) {
	t.Parallel()
	var stolen atomic.Int64
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stolen.Add(1) }))
	t.Cleanup(thief.Close)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, thief.URL+"/collect?k=SECRETPATH", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)

	senders := map[string]Sender{}
	var err error
	senders["webhook"], err = Webhook{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, redirector.URL)), envWith("", ""))
	require.NoError(t, err)
	senders["whatsapp"] = waSender(t, waAccount(t, redirector.URL, ""))
	senders["wxpusher"] = wxSender(t, wxAccount(t, redirector.URL, ""))
	for name, s := range senders {
		to := "+8613800000001"
		if name == "wxpusher" {
			to = "UID_a"
		}
		res := s.Send(context.Background(), []Message{{ID: "j1", TaskID: "t", To: to, Body: "hi"}})
		require.Len(t, res, 1)
		require.Equal(t, contract.ClassPermanent, res[0].Class, name)
		require.Equal(t, "307", res[0].Code, name)
		require.Contains(t, res[0].Err, "HTTP 307: redirect to "+thief.URL+" not followed", name)
		require.NotContains(t, res[0].Err, "SECRETPATH", name)
	}
	require.Zero(t, stolen.Load(), "the redirect target got nothing")
}

// TestEndpointQueryNeverInResults: an endpoint may carry a token in its
// query string; url.Error quotes the whole URL and a provider may echo the
// request line. Neither reaches a Result.
func TestEndpointQueryNeverInResults(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad request to "+r.URL.String(), http.StatusInternalServerError)
	}))
	t.Cleanup(echo.Close)
	for _, endpoint := range []string{"http://" + closed + "/send?token=SECRET1234", echo.URL + "/send?token=SECRET1234", "http://user:SECRET1234@" + closed + "/send"} {
		s, err := Webhook{}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, endpoint)), envWith("", ""))
		require.NoError(t, err)
		res := s.Send(context.Background(), []Message{{ID: "j1", TaskID: "t", To: "a", Body: "hi"}})
		t.Logf("%s: %+v", RedactURL(endpoint), res[0])
		require.Equal(t, contract.ClassRetryable, res[0].Class)
		require.NotContains(t, res[0].Err, "SECRET1234")
		require.NotEmpty(t, res[0].Err)
	}
	wa := waSender(t, waAccount(t, "http://"+closed+"/?access_token=SECRET1234", ""))
	res := wa.Send(context.Background(), []Message{{ID: "j1", TaskID: "t", To: "+8613800000001", Body: "hi"}})
	require.Equal(t, "network", res[0].Code)
	require.Contains(t, res[0].Err, "?[redacted]")
	require.NotContains(t, res[0].Err, "SECRET1234")
}

// TestDenyPrivate: with NetPolicy.DenyPrivate a connection to a private,
// link-local or (unless allowed) loopback address is refused when it is
// dialled, so a name that resolves there is refused as well (here
// "localhost"); the answer is account fatal (every request of the account
// would be refused) and nothing reaches the server.
func TestDenyPrivate(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		_, _ = io.WriteString(w, `{"id":"x"}`)
	}))
	t.Cleanup(srv.Close)
	byName := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	send := func(p NetPolicy, endpoint string) Result {
		s, err := Webhook{Net: p}.NewSender(testAccount(t, fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, endpoint)), envWith("", ""))
		require.NoError(t, err)
		return s.Send(context.Background(), []Message{{ID: "j1", TaskID: "t", To: "a", Body: "hi"}})[0]
	}
	for _, endpoint := range []string{srv.URL, byName} {
		r := send(NetPolicy{DenyPrivate: true}, endpoint)
		require.Equal(t, contract.ClassAccountFatal, r.Class, endpoint)
		require.Equal(t, "denied_address", r.Code, endpoint)
		require.Contains(t, r.Err, "is a loopback address (DISPATCH_DENY_PRIVATE)", endpoint)
	}
	require.Zero(t, got.Load(), "nothing reached the server")
	require.True(t, send(NetPolicy{DenyPrivate: true, AllowLoopback: true}, srv.URL).OK())
	require.True(t, send(NetPolicy{}, byName).OK())
	require.Equal(t, int64(2), got.Load())

	p := NetPolicy{DenyPrivate: true, AllowLoopback: true}
	for addr, want := range map[string]string{
		"10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private", "169.254.169.254": "link-local",
		"100.64.0.1": "shared (carrier-grade NAT)", "0.0.0.0": "unspecified", "224.0.0.1": "link-local", "239.1.1.1": "multicast",
		"fd00::1": "private", "fe80::1": "link-local", "::ffff:10.0.0.1": "private", "::": "unspecified",
		"127.0.0.1": "", "::1": "", "8.8.8.8": "", "2001:4860:4860::8888": "",
	} {
		require.Equal(t, want, p.refusal(netip.MustParseAddr(addr)), addr)
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://h/send?token=x":        "http://h/send?[redacted]",
		"https://u:p@h:8/a#frag":       "https://h:8/a",
		"http://h/send":                "http://h/send",
		"http://h/send?":               "http://h/send",
		"::not a url?token=x":          "::not a url",
		"http://h/%zz?token=x":         "http://h/%zz",
		"https://graph.example.com/v1": "https://graph.example.com/v1",
	} {
		require.Equal(t, want, RedactURL(in), in)
	}
}

// TestClip: Result.Err is cut to maxErrLen bytes on a character boundary,
// so a provider's long answer in any script stays valid UTF-8.
func TestClip(t *testing.T) {
	t.Parallel()
	require.Equal(t, "short", clip("short"))
	exact := strings.Repeat("a", maxErrLen)
	require.Equal(t, exact, clip(exact), "at the limit nothing is cut")
	require.Equal(t, exact+"...", clip(exact+"b"))
	for _, long := range []string{
		strings.Repeat("é", maxErrLen),        // 2 bytes: the cut at 300 falls between characters
		"a" + strings.Repeat("é", maxErrLen),  // ... and here inside one
		"a" + strings.Repeat("你", maxErrLen),  // 3 bytes
		"ab" + strings.Repeat("😀", maxErrLen), // 4 bytes
	} {
		got := clip(long)
		require.True(t, utf8.ValidString(got), "%q", got)
		require.True(t, strings.HasSuffix(got, "..."))
		body := strings.TrimSuffix(got, "...")
		require.True(t, strings.HasPrefix(long, body))
		require.LessOrEqual(t, len(body), maxErrLen)
		require.Greater(t, len(body), maxErrLen-utf8.UTFMax)
	}
}

// TestHTTPAdaptersShareTheClient: every HTTP adapter's client takes its
// proxy from the environment (HTTP_PROXY and friends), except under
// DenyPrivate, where the address check must see the destination, and none
// follows redirects.
func TestHTTPAdaptersShareTheClient(t *testing.T) {
	t.Parallel()
	env := envWith("BROADCAST_SECRET_X", "tok")
	build := map[string]func(NetPolicy) (Sender, error){
		"webhook": func(p NetPolicy) (Sender, error) {
			return Webhook{Net: p}.NewSender(testAccount(t, `{"channel":"webhook","endpoint":"http://gw.example/send","secret_env":"BROADCAST_SECRET_X"}`), env)
		},
		"whatsapp": func(p NetPolicy) (Sender, error) {
			return WhatsApp{Net: p}.NewSender(testAccount(t, `{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_X","phone_number_id":"1"}`), env)
		},
		"wxpusher": func(p NetPolicy) (Sender, error) {
			return WxPusher{Net: p}.NewSender(testAccount(t, `{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_X"}`), env)
		},
	}
	for name, newSender := range build {
		for _, p := range []NetPolicy{{}, {DenyPrivate: true}} {
			s, err := newSender(p)
			require.NoError(t, err, name)
			var c *http.Client
			switch s := s.(type) {
			case *webhookSender:
				c = s.client
			case *whatsappSender:
				c = s.client
			case *wxpusherSender:
				c = s.client
			default:
				t.Fatalf("%s: sender %T has no known client", name, s)
			}
			tr, ok := c.Transport.(*http.Transport)
			require.True(t, ok, name)
			require.Equal(t, !p.DenyPrivate, tr.Proxy != nil, "%s with %+v: proxy from the environment", name, p)
			require.NotNil(t, c.CheckRedirect, name)
		}
	}
}
