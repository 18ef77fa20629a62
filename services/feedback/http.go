package feedback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
)

// Route names, as the refused counter labels them.
const (
	routeWhatsApp = "whatsapp"
	routeReceipts = "receipts"
	routeBounce   = "bounce"
)

// handler returns the webhook routes.
func (s *Service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /webhooks/whatsapp", s.whatsappHandshake)
	mux.HandleFunc("POST /webhooks/whatsapp", s.whatsappPost)
	mux.HandleFunc("POST /webhooks/receipts", s.receiptsPost)
	mux.HandleFunc("POST /webhooks/bounce", s.bouncePost)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	slots := make(chan struct{}, s.cfg.MaxInFlight)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			mux.ServeHTTP(w, r)
		default:
			s.refuse(w, routeOf(r.URL.Path), metrics.RefusedUnavailable, http.StatusServiceUnavailable, "busy; try again")
		}
	})
}

// routeOf names a path's route for the refused counter.
func routeOf(path string) string {
	switch path {
	case "/webhooks/whatsapp":
		return routeWhatsApp
	case "/webhooks/receipts":
		return routeReceipts
	case "/webhooks/bounce":
		return routeBounce
	}
	return "other"
}

// serve listens on the configured address and serves the routes until
// ctx ends, then shuts the server down, letting requests in progress
// finish storing their receipts.
func (s *Service) serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler: s.handler(),
		// Providers retry slow webhooks; a client that dribbles its
		// request must not hold a connection for long either.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("feedback: http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout+time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// readBody reads a request body of at most MaxBody bytes. A larger one is
// refused with 413 and counted; false means the answer was written.
func (s *Service) readBody(w http.ResponseWriter, r *http.Request, route string) ([]byte, bool) {
	if r.ContentLength > s.cfg.MaxBody {
		s.refuse(w, route, metrics.RefusedTooLarge, http.StatusRequestEntityTooLarge,
			fmt.Sprintf("body: %d bytes, limit is %d", r.ContentLength, s.cfg.MaxBody))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.refuse(w, route, metrics.RefusedTooLarge, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("body: larger than the limit of %d bytes", s.cfg.MaxBody))
			return nil, false
		}
		s.refuse(w, route, metrics.RefusedBadRequest, http.StatusBadRequest, "body: "+err.Error())
		return nil, false
	}
	return body, true
}

// refuse answers a request feedback does not accept, counts it, and logs
// why (never the body or a secret).
func (s *Service) refuse(w http.ResponseWriter, route, reason string, code int, msg string) {
	s.cfg.metrics.Refused(route, reason)
	s.log.Warn("webhook refused", "route", route, "reason", reason, "status", code, "err", msg)
	http.Error(w, msg, code)
}

// store writes receipts to RECEIPTS and waits until the server has them:
// only then may the provider be told 200. It answers the request.
func (s *Service) store(w http.ResponseWriter, r *http.Request, route string, receipts []Receipt) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, 0, len(receipts))
	for i := range receipts {
		data, err := json.Marshal(&receipts[i])
		if err == nil {
			var f jetstream.PubAckFuture
			f, err = s.js.PublishAsync(contract.ReceiptSubject(receipts[i].Source, receipts[i].Account), data,
				jetstream.WithMsgID(receipts[i].msgID()))
			futures = append(futures, f)
		}
		if err != nil {
			s.refuse(w, route, metrics.RefusedUnavailable, http.StatusServiceUnavailable, "storing the receipt failed; try again")
			return
		}
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			s.log.Warn("storing a receipt failed", "route", route, "err", err)
			s.refuse(w, route, metrics.RefusedUnavailable, http.StatusServiceUnavailable, "storing the receipt failed; try again")
			return
		case <-ctx.Done():
			s.refuse(w, route, metrics.RefusedUnavailable, http.StatusServiceUnavailable, "storing the receipt timed out; try again")
			return
		}
	}
	for _, rc := range receipts {
		s.cfg.metrics.Receipt(rc.Source, metrics.ReceiptStored, 1)
	}
	s.stored.Add(int64(len(receipts)))
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"ok":true,"stored":%d}`+"\n", len(receipts))
}
