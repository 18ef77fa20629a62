package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits on what a send request may carry.
const (
	// maxBodyBytes bounds a send request body; larger ones get 413.
	maxBodyBytes = 1 << 20
	// maxRecipientBytes is the contract's limit on "to".
	maxRecipientBytes = 256
)

// Header names of the webhook protocol.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerSignature      = "X-Broadcast-Signature"
	signaturePrefix      = "sha256="
)

// Gateway is a simulated webhook provider: an http.Handler that answers the
// webhook protocol with faults drawn from its Config and records everything
// in a Ledger. It is safe for concurrent use.
//
// Routes: POST /, POST /send and POST on any path ending in /send deliver a
// message; GET /ledger returns the Ledger as JSON; POST /reset clears it;
// POST /storm?for=5s starts a storm (see Storm); GET /healthz answers 200.
type Gateway struct {
	cfg    Config
	secret []byte
	// retryAfter is cfg.RetryAfter as a Retry-After value.
	retryAfter int64
	// now is the gateway's monotonic clock; tests replace it.
	now func() time.Duration
	// seq numbers provider message ids; it survives Reset so ids stay unique.
	seq atomic.Uint64
	// tape is cfg.Tape indexed by key and attempt (nil without a tape).
	tape map[tapeKey]TapeAnswer

	mu    sync.Mutex
	state ledgerState
	// stormUntil ends the current storm (Storm), on the now clock.
	stormUntil time.Duration
}

// New returns a Gateway for cfg. Zero fields take the defaults documented on
// Config; a bad field yields an error wrapping ErrInvalidConfig that names it.
func New(cfg Config) (*Gateway, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	epoch := time.Now()
	g := &Gateway{
		cfg:        cfg,
		retryAfter: retryAfterSeconds(cfg.RetryAfter),
		now:        func() time.Duration { return time.Since(epoch) },
		state:      newLedgerState(),
		tape:       cfg.Tape.tapeIndex(),
	}
	if cfg.Secret != "" {
		g.secret = []byte(cfg.Secret)
	}
	return g, nil
}

// Ledger returns a snapshot of the ledger. It copies every map, so it costs
// time proportional to the number of keys seen; poll it, do not spin on it.
func (g *Gateway) Ledger() Ledger {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state.snapshot()
}

// Reset clears the ledger and refills every account's token bucket.
// Requests in flight are recorded in the new ledger.
func (g *Gateway) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state = newLedgerState()
}

// Storm makes the gateway answer every send request 429, with Retry-After
// as configured, for d from now: a provider refusing everything for a
// while. Storm answers are counted in Injected["429"], come after the
// signature and shape checks, and take no token of the account's bucket.
// A later call replaces the window; d <= 0 ends a storm at once.
func (g *Gateway) Storm(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stormUntil = g.now() + max(d, 0)
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/ledger":
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		writeJSON(w, http.StatusOK, g.Ledger())
	case p == "/reset":
		if !allow(w, r, http.MethodPost) {
			return
		}
		g.Reset()
		w.WriteHeader(http.StatusNoContent)
	case p == "/storm":
		if !allow(w, r, http.MethodPost) {
			return
		}
		d, err := time.ParseDuration(r.URL.Query().Get("for"))
		if err != nil {
			writeError(w, http.StatusBadRequest, "for: want a Go duration such as 5s")
			return
		}
		g.Storm(d)
		w.WriteHeader(http.StatusNoContent)
	case p == "/healthz":
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	case p == "/" || strings.HasSuffix(p, "/send"):
		if !allow(w, r, http.MethodPost) {
			return
		}
		g.send(w, r)
	default:
		writeError(w, http.StatusNotFound, "no such route")
	}
}

// allow answers 405 and returns false unless r uses one of methods.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	return false
}

// message is the JSON body of a send request.
type message struct {
	ID      string `json:"id"`
	TaskID  string `json:"task_id"`
	To      string `json:"to"`
	Body    string `json:"body"`
	Account string `json:"account"`
	Attempt int    `json:"attempt"`
}

// verdict is how a send request is answered.
type verdict int

const (
	verdictAccept verdict = iota
	verdictRefuse
	verdictBadSignature
	verdictBadRequest
	verdictTooLarge
	verdictFault
	verdictStorm
)

// send handles one delivery: checks run outside the lock, then one short
// critical section decides the rate limit and records the outcome.
func (g *Gateway) send(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(headerIdempotencyKey)
	raw, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if g.cfg.Latency > 0 {
		time.Sleep(g.cfg.Latency)
	}

	var msg message
	v := verdictAccept
	var why string
	var f fault
	var taped *TapeAnswer
	switch {
	case readErr != nil:
		v, why = verdictBadRequest, "cannot read body"
		if _, ok := errors.AsType[*http.MaxBytesError](readErr); ok {
			v, why = verdictTooLarge, "body too large"
		}
	case g.secret != nil && !validSignature(g.secret, raw, r.Header.Get(headerSignature)):
		v, why = verdictBadSignature, "missing or wrong "+headerSignature
	default:
		why = parse(raw, key, &msg)
		if why != "" {
			v = verdictBadRequest
		}
	}
	if v == verdictAccept && g.tape != nil {
		if a, ok := g.tape[tapeKey{key, msg.Attempt}]; ok {
			taped = &a
			if a.Latency > 0 {
				time.Sleep(a.Latency)
			}
		}
	}
	if v == verdictAccept {
		switch {
		case taped != nil:
			v, f, why = tapeVerdict(*taped)
		case g.cfg.Unauthorized:
			v, f, why = verdictFault, fault401, "account not authorised"
		case g.cfg.FatalPrefix != "" && strings.HasPrefix(msg.To, g.cfg.FatalPrefix):
			v, f, why = verdictFault, fault401, "account not authorised for this recipient"
		case g.cfg.PermanentPrefix != "" && strings.HasPrefix(msg.To, g.cfg.PermanentPrefix):
			v, f, why = verdictFault, fault400, "invalid recipient"
		default:
			v, f, why = g.drawFault(key, msg.Attempt)
		}
	}

	// Decide the rate limit and record, at one instant, under the lock.
	var wait time.Duration
	g.mu.Lock()
	s := &g.state
	now := g.now()
	s.requests++
	ks := s.key(key)
	ks.requests++
	switch v {
	case verdictBadSignature:
		s.badSignature++
	case verdictBadRequest, verdictTooLarge:
		s.badRequest++
	default:
		acct := s.account(msg.Account)
		if now < g.stormUntil && taped == nil {
			v, why = verdictStorm, "storm: every request refused"
			s.injected[fault429]++
			break
		}
		if g.cfg.RatePerSec > 0 && taped == nil {
			var ok bool
			if ok, wait = acct.bucket.take(now, g.cfg.RatePerSec, g.cfg.Burst); !ok {
				v, why = verdictRefuse, "rate limit exceeded"
				s.refused++
				break
			}
		}
		if v == verdictFault {
			s.injected[f]++
			break
		}
		s.accepted++
		ks.accepted++
		if ks.accepted > 1 {
			s.duplicates++
		}
		ks.body = msg.Body
		acct.accept(now)
	}
	g.mu.Unlock()

	switch v {
	case verdictAccept:
		g.writeAccepted(w)
	case verdictRefuse:
		g.writeRetryAfter(w, max(g.retryAfter, retryAfterSeconds(wait)), why)
	case verdictStorm:
		g.writeRetryAfter(w, g.retryAfter, why)
	case verdictBadSignature:
		writeError(w, http.StatusUnauthorized, why)
	case verdictBadRequest:
		writeError(w, http.StatusBadRequest, why)
	case verdictTooLarge:
		writeError(w, http.StatusRequestEntityTooLarge, why)
	case verdictFault:
		switch f {
		case fault429:
			if g.cfg.OmitInjectedRetryAfter && taped == nil {
				writeError(w, http.StatusTooManyRequests, why)
				break
			}
			secs := g.retryAfter
			if taped != nil {
				secs = 0
				if taped.RetryAfter > 0 {
					secs = retryAfterSeconds(taped.RetryAfter)
				}
			}
			g.writeRetryAfter(w, secs, why)
		case fault504:
			g.hang(r)
			writeError(w, http.StatusGatewayTimeout, why)
		case fault503:
			status := http.StatusServiceUnavailable
			if taped != nil {
				status = taped.Status
			}
			writeError(w, status, why)
		case fault400:
			status := http.StatusBadRequest
			if taped != nil {
				status = taped.Status
			}
			writeError(w, status, why)
		case fault401:
			status := http.StatusUnauthorized
			if taped != nil {
				status = taped.Status
			}
			writeError(w, status, why)
		}
	}
}

// parse decodes raw into msg and checks it against the Idempotency-Key
// header. It returns why the request is malformed, or "".
func parse(raw []byte, key string, msg *message) string {
	if err := json.Unmarshal(raw, msg); err != nil {
		return "body is not the webhook JSON object"
	}
	switch {
	case msg.ID == "":
		return "id: required"
	case msg.To == "":
		return "to: required"
	case len(msg.To) > maxRecipientBytes:
		return "to: longer than 256 bytes"
	case key == "":
		return headerIdempotencyKey + ": required"
	case key != msg.ID:
		return headerIdempotencyKey + ": differs from body id"
	}
	return ""
}

// validSignature reports whether header is sha256=<hex HMAC-SHA256 of raw
// under secret>, comparing in constant time.
func validSignature(secret, raw []byte, header string) bool {
	hexSum, ok := strings.CutPrefix(header, signaturePrefix)
	if !ok {
		return false
	}
	got, err := hex.DecodeString(hexSum)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(raw)
	return hmac.Equal(got, mac.Sum(nil))
}

// drawFault decides the injected fault, if any, for a request that passed
// every check. The fault rates partition [0, 1) so one draw suffices.
func (g *Gateway) drawFault(key string, attempt int) (verdict, fault, string) {
	c := &g.cfg
	if c.FailRate == 0 && c.RateLimitedRate == 0 && c.TimeoutRate == 0 {
		return verdictAccept, 0, ""
	}
	u := g.draw(key, attempt)
	switch {
	case u < c.FailRate:
		return verdictFault, fault503, "injected failure"
	case u < c.FailRate+c.RateLimitedRate:
		return verdictFault, fault429, "injected rate limit"
	case u < c.FailRate+c.RateLimitedRate+c.TimeoutRate:
		return verdictFault, fault504, "injected timeout"
	}
	return verdictAccept, 0, ""
}

// draw returns a number in [0, 1): a hash of (Seed, key, attempt) when Seed
// is set, otherwise a fresh random number.
func (g *Gateway) draw(key string, attempt int) float64 {
	if g.cfg.Seed == 0 {
		return rand.Float64()
	}
	return unitFloat(hashDecision(g.cfg.Seed, key, attempt))
}

// hashDecision is FNV-1a over seed, key and attempt (seed and attempt as 8
// bytes each, so the input is unambiguous) finished with the splitmix64
// mixer, so nearby keys give unrelated draws. Changing it changes every
// seeded run; TestSeedDeterminism pins it.
func hashDecision(seed uint64, key string, attempt int) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := range 8 {
		h = (h ^ (seed >> (8 * i) & 0xff)) * prime
	}
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	a := uint64(attempt)
	for i := range 8 {
		h = (h ^ (a >> (8 * i) & 0xff)) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// unitFloat maps h uniformly onto [0, 1).
func unitFloat(h uint64) float64 { return float64(h>>11) * 0x1p-53 }

// hang waits Hang, or until the client gives up.
func (g *Gateway) hang(r *http.Request) {
	t := time.NewTimer(g.cfg.Hang)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}

// writeAccepted answers 200 with a fresh provider message id.
func (g *Gateway) writeAccepted(w http.ResponseWriter) {
	buf := make([]byte, 0, 40)
	buf = append(buf, `{"id":"gw-`...)
	buf = strconv.AppendUint(buf, g.seq.Add(1), 10)
	buf = append(buf, "\"}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(buf)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf)
}

// writeRetryAfter answers 429 with Retry-After: secs, or without it when
// secs is 0 or the gateway sends none (Config.NoRetryAfter).
func (g *Gateway) writeRetryAfter(w http.ResponseWriter, secs int64, why string) {
	if secs > 0 && !g.cfg.NoRetryAfter {
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	writeError(w, http.StatusTooManyRequests, why)
}

// errorBody is the JSON of every non-2xx answer.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"cannot encode answer"}`)
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
