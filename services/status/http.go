package status

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/shared"
)

// web holds the dashboard page: HTML, one script and one stylesheet, no
// external resources.
//
//go:embed web
var web embed.FS

// backend is what the HTTP API reads and does; the dashboard implements it
// over NATS, tests with a fake.
type backend interface {
	snapshot() *Snapshot
	snapshotJSON() []byte
	task(id string) (*contract.Progress, bool)
	// changes returns a channel closed at the next change.
	changes() <-chan struct{}
	control(ctx context.Context, taskID, action string) (*contract.ControlReply, error)
}

// Event stream pacing: a change is pushed at most every minPush, and a
// snapshot goes out at least every maxQuiet so rates, ETAs and the page's
// liveness indicator stay current.
const (
	minPush  = 250 * time.Millisecond
	maxQuiet = time.Second
)

// controlTimeout bounds a control request forwarded to NATS.
const controlTimeout = 10 * time.Second

// newHandler routes the dashboard's HTTP API:
//
//	GET  /                          the dashboard page (with /app.js, /style.css)
//	GET  /api/events                server-sent events: a Snapshot per "snapshot" event,
//	                                on change (at most 4 a second) and at least once a second
//	GET  /api/tasks                 {"tasks":[progress...],"more":n}
//	GET  /api/tasks/{id}            one task's progress
//	GET  /api/accounts              {"accounts":[AccountView...]}
//	POST /api/tasks/{id}/{action}   pause, resume, cancel or retry-dead, forwarded to
//	                                broadcast.control.<id>; answers the control reply
//	GET  /tasks/{id}, /api/series, /api/lookup, /api/tasks/{id}/dead|failures|events
//	                                the operator's view (story.go)
//	GET  /metrics                   Prometheus metrics (when a registry is set)
//	GET  /healthz                   "ok"
//
// Cross-origin POSTs are refused (http.CrossOriginProtection), so another
// site open in the operator's browser cannot press the buttons; requests
// naming another Host, or without the token when one is set, are refused
// (guard.go); at most maxStreams event streams run at once.
func newHandler(b backend, reg *prometheus.Registry, log *slog.Logger, g *guard, maxStreams int) http.Handler {
	streams := make(streamSlots, max(maxStreams, 1))
	mux := http.NewServeMux()
	page, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded directory exists at build time
	}
	mux.Handle("GET /", http.FileServerFS(page))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /api/events", func(w http.ResponseWriter, r *http.Request) {
		if !streams.take() {
			w.Header().Set("Retry-After", "5")
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "too many event-stream clients"})
			return
		}
		defer streams.give()
		serveEvents(w, r, b)
	})
	mux.HandleFunc("GET /api/tasks", func(w http.ResponseWriter, _ *http.Request) {
		s := b.snapshot()
		writeJSON(w, http.StatusOK, map[string]any{"tasks": s.Tasks, "more": s.More})
	})
	mux.HandleFunc("GET /api/accounts", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"accounts": b.snapshot().Accounts})
	})
	mux.HandleFunc("GET /api/tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		p, ok := b.task(r.PathValue("id"))
		if !ok {
			writeJSON(w, http.StatusNotFound, contract.ControlReply{Error: "no task " + r.PathValue("id")})
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("POST /api/tasks/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		serveControl(w, r, b, log)
	})
	storyRoutes(mux, b, func(w http.ResponseWriter, r *http.Request) {
		r.SetPathValue("action", contract.ActionRetryDead)
		serveControl(w, r, b, log)
	})
	if reg != nil {
		mux.Handle("GET /metrics", metrics.Handler(reg))
	}
	return securityHeaders(g.wrap(http.NewCrossOriginProtection().Handler(mux)))
}

// serveControl forwards one button press to broadcast.control.<id>.
func serveControl(w http.ResponseWriter, r *http.Request, b backend, log *slog.Logger) {
	id, action := r.PathValue("id"), r.PathValue("action")
	if !contract.ValidID(id) {
		writeJSON(w, http.StatusBadRequest, contract.ControlReply{Error: "task id must match [A-Za-z0-9_-]{1,64}"})
		return
	}
	switch action {
	case contract.ActionPause, contract.ActionResume, contract.ActionCancel, contract.ActionRetryDead:
	default:
		writeJSON(w, http.StatusNotFound, contract.ControlReply{Error: "action must be pause, resume, cancel or retry-dead"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), controlTimeout)
	defer cancel()
	reply, err := b.control(ctx, id, action)
	switch {
	case err == nil:
		log.Info("control request from the dashboard", shared.KeyTaskID, id, "action", action, "state", reply.State)
		writeJSON(w, http.StatusOK, reply)
	case reply != nil:
		// Refused by ingest (e.g. the task is already final).
		writeJSON(w, http.StatusConflict, reply)
	case errors.Is(err, nats.ErrNoResponders):
		writeJSON(w, http.StatusServiceUnavailable, contract.ControlReply{Error: "no ingest service answers control requests"})
	default:
		log.Warn("control request from the dashboard failed", shared.KeyTaskID, id, "action", action, "err", err)
		writeJSON(w, http.StatusBadGateway, contract.ControlReply{Error: err.Error()})
	}
}

// serveEvents streams snapshots as server-sent events until the client
// goes away or the service stops.
func serveEvents(w http.ResponseWriter, r *http.Request, b backend) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
	w.WriteHeader(http.StatusOK)
	send := func() bool {
		// JSON has no raw newlines, so one data line carries the event.
		if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", b.snapshotJSON()); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil || !send() {
		return
	}
	quiet := time.NewTimer(maxQuiet)
	defer quiet.Stop()
	for {
		wake := b.changes()
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		case <-quiet.C:
		}
		if !send() {
			return
		}
		quiet.Reset(maxQuiet)
		select { // at most one push per minPush
		case <-r.Context().Done():
			return
		case <-time.After(minPush):
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// securityHeaders forbids everything the page does not need: no inline or
// foreign scripts, styles, frames or connections.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}
