package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/fakes"
	"github.com/broadcastd/broadcast/internal/gateway"
)

// hit is one send request as a recording provider saw it.
type hit struct {
	at      time.Time
	to      string
	key     string
	account string
	status  int
}

// recorder wraps a provider handler, recording every send request with its
// arrival time and answer. With windowLimit > 0 it also refuses (429) any
// request that would make more than windowLimit accepted requests in one
// second, sliding: the strict gateway that pacing must never trip.
type recorder struct {
	URL         string
	windowLimit int

	mu      sync.Mutex
	hits    []hit
	window  []time.Time // accepted arrivals of the last second
	refused int
}

// startRecorder serves h behind a recorder until the test ends.
func startRecorder(t *testing.T, h http.Handler, windowLimit int) *recorder {
	t.Helper()
	rec := &recorder{windowLimit: windowLimit}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		at := time.Now()
		raw, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		var body struct {
			To      string `json:"to"`
			Account string `json:"account"`
		}
		_ = json.Unmarshal(raw, &body)
		hi := hit{at: at, to: body.To, key: r.Header.Get("Idempotency-Key"), account: body.Account}
		if rec.overLimit(at) {
			hi.status = http.StatusTooManyRequests
			rec.add(hi)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"more than rate+burst in one second"}`, http.StatusTooManyRequests)
			return
		}
		sw := &fakes.StatusRecorder{ResponseWriter: w, Status: http.StatusOK}
		h.ServeHTTP(sw, r)
		hi.status = sw.Status
		rec.add(hi)
	}))
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

// startRecordedGateway serves a fault-injecting gateway behind a recorder.
func startRecordedGateway(t *testing.T, cfg gateway.Config, windowLimit int) (*gateway.Gateway, *recorder) {
	t.Helper()
	g, err := gateway.New(cfg)
	require.NoError(t, err)
	return g, startRecorder(t, g, windowLimit)
}

// recordedGateway is the fault-injecting gateway behind a recorder that
// refuses nothing itself.
type recordedGateway struct {
	*gateway.Gateway
	*recorder
}

// startGateway serves a fault-injecting gateway behind a recorder until the
// test ends.
func startGateway(t *testing.T, cfg gateway.Config) *recordedGateway {
	t.Helper()
	g, rec := startRecordedGateway(t, cfg, 0)
	return &recordedGateway{Gateway: g, recorder: rec}
}

// gatewayOK is a gateway that injects no faults.
func gatewayOK() gateway.Config { return gateway.Config{Seed: 1} }

func (rec *recorder) overLimit(at time.Time) bool {
	if rec.windowLimit <= 0 {
		return false
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	i := 0
	for i < len(rec.window) && at.Sub(rec.window[i]) >= time.Second {
		i++
	}
	rec.window = rec.window[i:]
	if len(rec.window) >= rec.windowLimit {
		rec.refused++
		return true
	}
	rec.window = append(rec.window, at)
	return false
}

func (rec *recorder) add(h hit) {
	rec.mu.Lock()
	rec.hits = append(rec.hits, h)
	rec.mu.Unlock()
}

// all returns the recorded hits in arrival order.
func (rec *recorder) all() []hit {
	rec.mu.Lock()
	out := append([]hit(nil), rec.hits...)
	rec.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// accepted returns the 2xx hits in arrival order.
func (rec *recorder) accepted() []hit {
	return filterHits(rec.all(), func(h hit) bool { return h.status/100 == 2 })
}

// refusedByWindow counts the requests refused for the sliding window.
func (rec *recorder) refusedByWindow() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.refused
}

// firstArrival is when the first request arrived (zero when none has).
func (rec *recorder) firstArrival() time.Time {
	if hs := rec.all(); len(hs) > 0 {
		return hs[0].at
	}
	return time.Time{}
}

// lastArrival is when the latest request arrived (zero when none has).
func (rec *recorder) lastArrival() time.Time {
	if hs := rec.all(); len(hs) > 0 {
		return hs[len(hs)-1].at
	}
	return time.Time{}
}

func filterHits(hs []hit, keep func(hit) bool) []hit {
	var out []hit
	for _, h := range hs {
		if keep(h) {
			out = append(out, h)
		}
	}
	return out
}

// pacingFigures summarises arrival times against a rate and burst.
type pacingFigures struct {
	n             int
	period        time.Duration
	rate          float64 // (n-1) / period
	maxInSecond   int     // sliding one-second window
	overLimitSecs int     // fixed one-second slots above rate+burst
}

func measurePacing(hs []hit, limit int) pacingFigures {
	f := pacingFigures{n: len(hs)}
	if len(hs) < 2 {
		return f
	}
	f.period = hs[len(hs)-1].at.Sub(hs[0].at)
	f.rate = float64(len(hs)-1) / f.period.Seconds()
	lo := 0
	slots := map[int]int{}
	for i, h := range hs {
		for h.at.Sub(hs[lo].at) >= time.Second {
			lo++
		}
		f.maxInSecond = max(f.maxInSecond, i-lo+1)
		slots[int(h.at.Sub(hs[0].at)/time.Second)]++
	}
	for _, c := range slots {
		if c > limit {
			f.overLimitSecs++
		}
	}
	return f
}

func (f pacingFigures) String() string {
	return fmt.Sprintf("%d requests in %s: %.1f/s, max %d in any 1-s window, %d fixed seconds over the limit",
		f.n, f.period.Round(time.Millisecond), f.rate, f.maxInSecond, f.overLimitSecs)
}

// startSMTP runs an SMTP fake until the test ends that accepts every mail
// except for the addresses given a reply.
func startSMTP(t *testing.T, replies map[string]string) *fakes.SMTP {
	t.Helper()
	srv, err := fakes.StartSMTP(fakes.SMTPConfig{Rcpt: func(addr string) string { return replies[addr] }})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}
