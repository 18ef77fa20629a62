package status

import (
	"net/http"
	"strings"
)

// Roles of the dashboard's tokens.
const (
	roleOperator = "operator"
	roleViewer   = "viewer"
)

// withViewer adds the viewer token (DASHBOARD_VIEWER_TOKEN) to g.
func (g *guard) withViewer(token string) *guard {
	g.viewer = token
	return g
}

// viewerMay reports whether the viewer token may make r: reads of the
// pages, progress, accounts, charts and metrics; no button (every POST)
// and nothing that shows recipients (dead letters, events, failures with
// their examples, lookups), which are personal data for operators only.
func viewerMay(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	p := r.URL.Path
	if p == "/api/lookup" {
		return false
	}
	if rest, ok := strings.CutPrefix(p, "/api/tasks/"); ok {
		_, sub, nested := strings.Cut(rest, "/")
		return !nested || sub == ""
	}
	return true
}
