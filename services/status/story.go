package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// operatorBackend is what the operator's pages read beyond the live
// snapshot: a task's story (its series, failures, dead letters and
// events), an account's series, a recipient's outcomes, and the retry of
// a selection of dead letters. The dashboard implements it over NATS.
type operatorBackend interface {
	seriesView(name string, account bool, seconds int) (*SeriesView, bool)
	deadLetters(ctx context.Context, taskID string, offset, limit int) (*client.DeadPage, error)
	failures(ctx context.Context, taskID string) (*client.Failures, error)
	events(ctx context.Context, taskID string, kind contract.EventKind, after uint64, limit int) (*client.EventsPage, error)
	lookup(ctx context.Context, to string) (*client.Lookup, error)
	retrySelected(ctx context.Context, taskID string, seqs []uint64) (*contract.ControlReply, error)
}

// Default page sizes of the dead letters and events.
const (
	defaultDeadPage   = 50
	defaultEventsPage = 100
)

// storyRoutes adds the operator's routes when b has them:
//
//	GET  /tasks/{id}                     a task's story (web/task.html)
//	GET  /api/series?task=|account=      per-second (last &seconds=, default 600,
//	                                     at most 3600) and per-minute counts
//	GET  /api/tasks/{id}/failures        failures grouped by kind, code and account
//	GET  /api/tasks/{id}/dead            dead letters, ?offset= (0) &limit= (50, at most 500)
//	GET  /api/tasks/{id}/events          events, ?kind= &after=<seq> &limit= (100, at most 500)
//	POST /api/tasks/{id}/retry-dead      body {"seqs":[...]} re-queues those dead letters only;
//	                                     without seqs, all (the control action)
//	GET  /api/lookup?to=<recipient>      the recipient's outcomes in every task
func storyRoutes(mux *http.ServeMux, b backend, serveControlAll http.HandlerFunc) {
	ob, ok := b.(operatorBackend)
	if !ok {
		return
	}
	mux.HandleFunc("GET /tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, web, "web/task.html")
	})
	mux.HandleFunc("GET /api/series", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		task, account := q.Get("task"), q.Get("account")
		if (task == "") == (account == "") {
			badRequest(w, "task, account: give exactly one")
			return
		}
		name := task + account
		if !contract.ValidID(name) {
			badRequest(w, "task, account: must match [A-Za-z0-9_-]{1,64}")
			return
		}
		seconds, ok := intParam(w, q.Get("seconds"), "seconds", 600, 1, secondsKept)
		if !ok {
			return
		}
		v, found := ob.seriesView(name, account != "", seconds)
		if !found {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no series for " + name + " (none of its events was folded by this process in the last day)"})
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
	mux.HandleFunc("GET /api/tasks/{id}/failures", func(w http.ResponseWriter, r *http.Request) {
		id, ok := taskParam(w, r)
		if !ok {
			return
		}
		answer(w, func() (any, error) { return ob.failures(r.Context(), id) })
	})
	mux.HandleFunc("GET /api/tasks/{id}/dead", func(w http.ResponseWriter, r *http.Request) {
		id, ok := taskParam(w, r)
		if !ok {
			return
		}
		offset, ok := intParam(w, r.URL.Query().Get("offset"), "offset", 0, 0, client.MaxDeadOffset)
		if !ok {
			return
		}
		limit, ok := intParam(w, r.URL.Query().Get("limit"), "limit", defaultDeadPage, 1, client.MaxDeadPage)
		if !ok {
			return
		}
		answer(w, func() (any, error) { return ob.deadLetters(r.Context(), id, offset, limit) })
	})
	mux.HandleFunc("GET /api/tasks/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		id, ok := taskParam(w, r)
		if !ok {
			return
		}
		q := r.URL.Query()
		kind := contract.EventKind(q.Get("kind"))
		if kind != "" && !knownKind(kind) {
			badRequest(w, fmt.Sprintf("kind: %q is not an event kind", kind))
			return
		}
		var after uint64
		if v := q.Get("after"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				badRequest(w, fmt.Sprintf("after: %q is not a stream sequence", v))
				return
			}
			after = n
		}
		limit, ok := intParam(w, q.Get("limit"), "limit", defaultEventsPage, 1, client.MaxEventsPage)
		if !ok {
			return
		}
		answer(w, func() (any, error) { return ob.events(r.Context(), id, kind, after, limit) })
	})
	mux.HandleFunc("POST /api/tasks/{id}/retry-dead", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Seqs []uint64 `json:"seqs"`
		}
		data, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			badRequest(w, "body: "+err.Error())
			return
		}
		if len(data) > 0 {
			if err := json.Unmarshal(data, &body); err != nil {
				badRequest(w, "body: must be {\"seqs\":[<dead letter seq>...]}: "+err.Error())
				return
			}
		}
		if len(body.Seqs) == 0 {
			serveControlAll(w, r)
			return
		}
		id, ok := taskParam(w, r)
		if !ok {
			return
		}
		if len(body.Seqs) > contract.MaxRetrySelection {
			badRequest(w, fmt.Sprintf("seqs: at most %d at once, got %d", contract.MaxRetrySelection, len(body.Seqs)))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), controlTimeout)
		defer cancel()
		reply, err := ob.retrySelected(ctx, id, body.Seqs)
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, reply)
		case reply != nil:
			writeJSON(w, http.StatusConflict, reply)
		default:
			writeJSON(w, http.StatusBadGateway, contract.ControlReply{Error: err.Error()})
		}
	})
	mux.HandleFunc("GET /api/lookup", func(w http.ResponseWriter, r *http.Request) {
		to := r.URL.Query().Get("to")
		if to == "" {
			badRequest(w, "to: give the recipient to look up")
			return
		}
		if len(to) > contract.MaxRecipientBytes {
			badRequest(w, fmt.Sprintf("to: is %d bytes, limit is %d", len(to), contract.MaxRecipientBytes))
			return
		}
		if _, err := suppress.Normalize(contract.ScopeAll, to); err != nil {
			badRequest(w, err.Error())
			return
		}
		answer(w, func() (any, error) { return ob.lookup(r.Context(), to) })
	})
}

func knownKind(k contract.EventKind) bool {
	switch k {
	case contract.EventAccepted, contract.EventRejected, contract.EventSent, contract.EventRetrying,
		contract.EventFailed, contract.EventSkipped, contract.EventExpired, contract.EventCancelled,
		contract.EventDelivered, contract.EventRead, contract.EventUndelivered:
		return true
	}
	return false
}

func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
}

// taskParam returns the path's task id, or answers 400 naming it.
func taskParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !contract.ValidID(id) {
		badRequest(w, "id: task id must match [A-Za-z0-9_-]{1,64}")
		return "", false
	}
	return id, true
}

// intParam parses a query parameter (def when absent) within lo..hi, or
// answers 400 naming it.
func intParam(w http.ResponseWriter, v, name string, def, lo, hi int) (int, bool) {
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		badRequest(w, fmt.Sprintf("%s: must be a whole number from %d to %d, got %q", name, lo, hi, v))
		return 0, false
	}
	return n, true
}

// answer writes what read returns, or 502 with the error of the NATS read
// behind it (404 when a stream is missing: the topology is older).
func answer(w http.ResponseWriter, read func() (any, error)) {
	v, err := read()
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, v)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error() + " (run `broadcast setup`)"})
	default:
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
	}
}

// The dashboard's operatorBackend: NATS reads through package client.

func (d *dashboard) seriesView(name string, account bool, seconds int) (*SeriesView, bool) {
	if d.series == nil {
		return nil, false
	}
	return d.series.view(name, account, seconds)
}

func (d *dashboard) deadLetters(ctx context.Context, taskID string, offset, limit int) (*client.DeadPage, error) {
	return client.DeadLetters(ctx, d.js, taskID, offset, limit)
}

func (d *dashboard) failures(ctx context.Context, taskID string) (*client.Failures, error) {
	return client.TaskFailures(ctx, d.js, taskID)
}

func (d *dashboard) events(ctx context.Context, taskID string, kind contract.EventKind, after uint64, limit int) (*client.EventsPage, error) {
	return client.TaskEvents(ctx, d.js, taskID, kind, after, limit)
}

func (d *dashboard) lookup(ctx context.Context, to string) (*client.Lookup, error) {
	return client.LookupRecipient(ctx, d.js, to)
}

func (d *dashboard) retrySelected(ctx context.Context, taskID string, seqs []uint64) (*contract.ControlReply, error) {
	return client.ControlRequest(ctx, d.js.Conn(), taskID, contract.ControlRequest{Action: contract.ActionRetryDead, Seqs: seqs})
}
