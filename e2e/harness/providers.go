package harness

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

// Hit is one send request as a recording provider saw it.
type Hit struct {
	At      time.Time
	To      string
	Key     string
	Account string
	Status  int
}

// Recorder wraps a provider handler, recording every send request with its
// arrival time and answer. With windowLimit > 0 it also refuses (429) any
// request that would make more than windowLimit accepted requests in one
// second, sliding: the strict gateway that pacing must never trip.
type Recorder struct {
	URL         string
	windowLimit int

	mu      sync.Mutex
	hits    []Hit
	window  []time.Time // accepted arrivals of the last second
	refused int
}

// StartRecorder serves h behind a recorder until the test ends.
func StartRecorder(t *testing.T, h http.Handler, windowLimit int) *Recorder {
	t.Helper()
	rec := &Recorder{windowLimit: windowLimit}
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
		hi := Hit{At: at, To: body.To, Key: r.Header.Get("Idempotency-Key"), Account: body.Account}
		if rec.overLimit(at) {
			hi.Status = http.StatusTooManyRequests
			rec.add(hi)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"more than rate+burst in one second"}`, http.StatusTooManyRequests)
			return
		}
		sw := &fakes.StatusRecorder{ResponseWriter: w, Status: http.StatusOK}
		h.ServeHTTP(sw, r)
		hi.Status = sw.Status
		rec.add(hi)
	}))
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

// StartRecordedGateway serves a fault-injecting gateway behind a recorder.
func StartRecordedGateway(t *testing.T, cfg gateway.Config, windowLimit int) (*gateway.Gateway, *Recorder) {
	t.Helper()
	g, err := gateway.New(cfg)
	require.NoError(t, err)
	return g, StartRecorder(t, g, windowLimit)
}

// RecordedGateway is the fault-injecting gateway behind a recorder that
// refuses nothing itself.
type RecordedGateway struct {
	*gateway.Gateway
	*Recorder
}

// StartGateway serves a fault-injecting gateway behind a recorder until the
// test ends.
func StartGateway(t *testing.T, cfg gateway.Config) *RecordedGateway {
	t.Helper()
	g, rec := StartRecordedGateway(t, cfg, 0)
	return &RecordedGateway{Gateway: g, Recorder: rec}
}

// GatewayOK is a gateway that injects no faults.
func GatewayOK() gateway.Config { return gateway.Config{Seed: 1} }

func (rec *Recorder) overLimit(at time.Time) bool {
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

func (rec *Recorder) add(h Hit) {
	rec.mu.Lock()
	rec.hits = append(rec.hits, h)
	rec.mu.Unlock()
}

// All returns the recorded hits in arrival order.
func (rec *Recorder) All() []Hit {
	rec.mu.Lock()
	out := append([]Hit(nil), rec.hits...)
	rec.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Accepted returns the 2xx hits in arrival order.
func (rec *Recorder) Accepted() []Hit {
	return FilterHits(rec.All(), func(h Hit) bool { return h.Status/100 == 2 })
}

// RefusedByWindow counts the requests refused for the sliding window.
func (rec *Recorder) RefusedByWindow() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.refused
}

// FirstArrival is when the first request arrived (zero when none has).
func (rec *Recorder) FirstArrival() time.Time {
	if hs := rec.All(); len(hs) > 0 {
		return hs[0].At
	}
	return time.Time{}
}

// LastArrival is when the latest request arrived (zero when none has).
func (rec *Recorder) LastArrival() time.Time {
	if hs := rec.All(); len(hs) > 0 {
		return hs[len(hs)-1].At
	}
	return time.Time{}
}

// FilterHits returns the hits keep holds for, in their order.
func FilterHits(hs []Hit, keep func(Hit) bool) []Hit {
	var out []Hit
	for _, h := range hs {
		if keep(h) {
			out = append(out, h)
		}
	}
	return out
}

// PacingFigures summarises arrival times against a rate and burst.
type PacingFigures struct {
	N             int
	Period        time.Duration
	Rate          float64 // (N-1) / Period
	MaxInSecond   int     // sliding one-second window
	OverLimitSecs int     // fixed one-second slots above rate+burst
}

// MeasurePacing measures hits, in arrival order, against limit (rate plus
// burst) requests a second.
func MeasurePacing(hs []Hit, limit int) PacingFigures {
	f := PacingFigures{N: len(hs)}
	if len(hs) < 2 {
		return f
	}
	f.Period = hs[len(hs)-1].At.Sub(hs[0].At)
	f.Rate = float64(len(hs)-1) / f.Period.Seconds()
	lo := 0
	slots := map[int]int{}
	for i, h := range hs {
		for h.At.Sub(hs[lo].At) >= time.Second {
			lo++
		}
		f.MaxInSecond = max(f.MaxInSecond, i-lo+1)
		slots[int(h.At.Sub(hs[0].At)/time.Second)]++
	}
	for _, c := range slots {
		if c > limit {
			f.OverLimitSecs++
		}
	}
	return f
}

func (f PacingFigures) String() string {
	return fmt.Sprintf("%d requests in %s: %.1f/s, max %d in any 1-s window, %d fixed seconds over the limit",
		f.N, f.Period.Round(time.Millisecond), f.Rate, f.MaxInSecond, f.OverLimitSecs)
}

// StartSMTP runs an SMTP fake until the test ends that accepts every mail
// except for the addresses given a reply.
func StartSMTP(t *testing.T, replies map[string]string) *fakes.SMTP {
	t.Helper()
	srv, err := fakes.StartSMTP(fakes.SMTPConfig{Rcpt: func(addr string) string { return replies[addr] }})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}
