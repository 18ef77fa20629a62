package status

import (
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDashboardViewerToken: the viewer token reads progress, accounts,
// charts and pages, but gets 403 for everything that shows recipients and
// for every button; the operator token gets all of it.
func TestDashboardViewerToken(t *testing.T) {
	t.Parallel()
	const operator, viewer = "operator-token", "viewer-token"
	f := newFakeOperator()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = newHandler(f, nil, slog.New(slog.DiscardHandler),
		newGuard(srv.Listener.Addr(), operator, nil).withViewer(viewer), 64)
	srv.Start()
	t.Cleanup(srv.Close)
	do := func(c *http.Client, method, path, token string) int {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"seqs":[1]}`))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := c.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	plain := http.DefaultClient
	for _, path := range []string{"/", "/app.js", "/api/tasks", "/api/tasks/running", "/api/accounts",
		"/api/series?task=running", "/account.html", "/tasks/running"} {
		require.Equal(t, http.StatusOK, do(plain, http.MethodGet, path, viewer), "viewer GET %s", path)
		require.Equal(t, http.StatusOK, do(plain, http.MethodGet, path, operator), "operator GET %s", path)
	}
	for _, path := range []string{"/api/tasks/running/dead", "/api/tasks/running/failures", "/api/tasks/running/events",
		"/api/lookup?to=x"} {
		require.Equal(t, http.StatusForbidden, do(plain, http.MethodGet, path, viewer), "viewer GET %s", path)
		require.Equal(t, http.StatusOK, do(plain, http.MethodGet, path, operator), "operator GET %s", path)
	}
	require.Equal(t, http.StatusForbidden, do(plain, http.MethodPost, "/api/tasks/running/pause", viewer))
	require.Equal(t, http.StatusForbidden, do(plain, http.MethodPost, "/api/tasks/running/retry-dead", viewer))
	require.Empty(t, f.controlCalls(), "no button pressed by the viewer")
	require.Empty(t, f.retried)
	require.Equal(t, http.StatusOK, do(plain, http.MethodPost, "/api/tasks/running/retry-dead", operator))
	require.Equal(t, []uint64{1}, f.retried)
	require.Equal(t, http.StatusUnauthorized, do(plain, http.MethodGet, "/api/tasks", "nobody"))

	// The viewer's link sets a cookie with the viewer's rights only.
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar}
	require.Equal(t, http.StatusOK, do(browser, http.MethodGet, "/?token="+viewer, ""))
	require.Equal(t, http.StatusOK, do(browser, http.MethodGet, "/api/tasks", ""))
	require.Equal(t, http.StatusForbidden, do(browser, http.MethodGet, "/api/lookup?to=x", ""))
}

func TestViewerTokenNeedsAnOperatorToken(t *testing.T) {
	t.Parallel()
	c := Config{DashboardViewerToken: "v"}
	require.ErrorContains(t, c.validate(), "DashboardViewerToken: needs a DashboardToken")
	c.DashboardToken = "v"
	require.ErrorContains(t, c.validate(), "different from it")
	c.DashboardToken = "o"
	require.NoError(t, c.validate())
}
