package status

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// tokenCookie carries DASHBOARD_TOKEN for the page's own requests (an
// EventSource cannot send an Authorization header).
const tokenCookie = "broadcast_dashboard"

// guard decides who may use the dashboard: requests must name one of its
// hosts (a DNS-rebinding page has the attacker's name in Host, so it gets
// nothing even though the browser counts it as same origin), and, with a
// token, carry it as "Authorization: Bearer <token>" or in the cookie that
// GET /?token=<token> sets. /healthz needs neither.
type guard struct {
	// hosts are the Host values accepted; empty accepts any (only allowed
	// with a token, whose cookie a rebinding page never gets).
	hosts map[string]bool
	token string
	// viewer is a second token that sees progress, accounts and charts
	// but no recipient and presses no button (viewer.go); "" for none.
	viewer string
}

// newGuard accepts the loopback names with the listener's port plus
// extra, or, for a listener beyond loopback without extra hosts, any Host
// (a token is then required by Config.validate).
func newGuard(addr net.Addr, token string, extra []string) *guard {
	g := &guard{token: token, hosts: map[string]bool{}}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return g
	}
	for _, h := range extra {
		if h = strings.TrimSpace(h); h != "" {
			g.hosts[strings.ToLower(h)] = true
			if _, _, err := net.SplitHostPort(h); err != nil {
				g.hosts[strings.ToLower(net.JoinHostPort(h, port))] = true
			}
		}
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
		for _, name := range []string{"127.0.0.1", "localhost", "::1", host} {
			g.hosts[net.JoinHostPort(name, port)] = true
		}
	}
	return g
}

func (g *guard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(g.hosts) > 0 && !g.hosts[strings.ToLower(r.Host)] {
			writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "Host " + r.Host + " is not this dashboard's (DASHBOARD_HOSTS adds names)"})
			return
		}
		if g.token == "" || r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		if t := r.URL.Query().Get("token"); t != "" && r.Method == http.MethodGet && r.URL.Path == "/" {
			if g.roleOf(t) == "" {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "wrong token"})
				return
			}
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			http.Redirect(w, r, "/", http.StatusSeeOther) // the token leaves the address bar
			return
		}
		role := ""
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			role = g.roleOf(bearer)
		}
		if c, err := r.Cookie(tokenCookie); err == nil && role == "" {
			role = g.roleOf(c.Value)
		}
		switch {
		case role == roleOperator:
			next.ServeHTTP(w, r)
			return
		case role == roleViewer && viewerMay(r):
			next.ServeHTTP(w, r)
			return
		case role == roleViewer:
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "the viewer token sees no recipients and presses no buttons: this needs DASHBOARD_TOKEN"})
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="broadcast dashboard"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "this dashboard needs DASHBOARD_TOKEN: open /?token=<token> or send Authorization: Bearer <token>"})
	})
}

// roleOf says whose token t is: roleOperator (DASHBOARD_TOKEN),
// roleViewer (DASHBOARD_VIEWER_TOKEN) or "" (neither).
func (g *guard) roleOf(t string) string {
	switch {
	case subtle.ConstantTimeCompare([]byte(t), []byte(g.token)) == 1:
		return roleOperator
	case g.viewer != "" && subtle.ConstantTimeCompare([]byte(t), []byte(g.viewer)) == 1:
		return roleViewer
	}
	return ""
}

// streamSlots bounds the event-stream clients; a client beyond them gets
// 503 and retries (the page's EventSource does).
type streamSlots chan struct{}

func (s streamSlots) take() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s streamSlots) give() { <-s }

// loopbackHost reports whether a listen address stays on this machine.
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
