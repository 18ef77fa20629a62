package status

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDashboardRefusesForeignHost: a request naming another host (what a
// DNS-rebinding page sends, same origin to the browser) gets nothing; the
// loopback names with the dashboard's port work.
func TestDashboardRefusesForeignHost(t *testing.T) {
	t.Parallel()
	srv := startHTTP(t, newFakeBackend(), nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	for host, want := range map[string]int{
		"evil.example:" + port: http.StatusMisdirectedRequest,
		"127.0.0.1:1":          http.StatusMisdirectedRequest,
		"127.0.0.1:" + port:    http.StatusOK,
		"localhost:" + port:    http.StatusOK,
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/api/tasks", nil)
		require.NoError(t, err)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, want, res.StatusCode, "Host %s", host)
	}
}

// TestDashboardToken: with a token every route but /healthz needs it, as a
// bearer header or through the cookie /?token= sets; a wrong one is refused.
func TestDashboardToken(t *testing.T) {
	t.Parallel()
	const token = "s3cret-dashboard-token"
	srv := startGuardedHTTP(t, newFakeBackend(), nil, token, 64)
	status := func(c *http.Client, path, auth string) int {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := c.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	plain := http.DefaultClient
	require.Equal(t, http.StatusOK, status(plain, "/healthz", ""))
	require.Equal(t, http.StatusUnauthorized, status(plain, "/api/tasks", ""))
	require.Equal(t, http.StatusUnauthorized, status(plain, "/", ""))
	require.Equal(t, http.StatusUnauthorized, status(plain, "/api/tasks", "Bearer wrong"))
	require.Equal(t, http.StatusOK, status(plain, "/api/tasks", "Bearer "+token))
	require.Equal(t, http.StatusUnauthorized, status(plain, "/?token=wrong", ""))

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar}
	require.Equal(t, http.StatusOK, status(browser, "/?token="+token, ""), "the token link sets the cookie and lands on the page")
	require.Equal(t, http.StatusOK, status(browser, "/api/tasks", ""), "the page's own requests carry the cookie")
}

// TestDashboardCapsEventStreams: clients beyond the cap get 503 with
// Retry-After; a slot freed is taken again.
func TestDashboardCapsEventStreams(t *testing.T) {
	t.Parallel()
	srv := startGuardedHTTP(t, newFakeBackend(), nil, "", 2)
	open := func() (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/events", nil)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return res, cancel
	}
	a, cancelA := open()
	b, cancelB := open()
	defer cancelB()
	require.Equal(t, http.StatusOK, a.StatusCode)
	require.Equal(t, http.StatusOK, b.StatusCode)
	c, cancelC := open()
	require.Equal(t, http.StatusServiceUnavailable, c.StatusCode)
	require.Equal(t, "5", c.Header.Get("Retry-After"))
	c.Body.Close()
	cancelC()
	cancelA()
	a.Body.Close()
	require.Eventually(t, func() bool {
		d, cancelD := open()
		defer cancelD()
		defer d.Body.Close()
		return d.StatusCode == http.StatusOK
	}, 5*time.Second, 50*time.Millisecond, "a freed slot is taken again")
	b.Body.Close()
}

// TestDashboardBeyondLoopbackNeedsToken: Config refuses a public listen
// address without a token, naming the setting.
func TestDashboardBeyondLoopbackNeedsToken(t *testing.T) {
	t.Parallel()
	c := Config{DashboardAddr: "0.0.0.0:8080"}
	require.ErrorContains(t, c.validate(), "DASHBOARD_TOKEN")
	c.DashboardToken = "x"
	require.NoError(t, c.validate())
	c = Config{DashboardAddr: "127.0.0.1:8080"}
	require.NoError(t, c.validate())
}
