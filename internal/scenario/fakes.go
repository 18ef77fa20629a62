package scenario

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/internal/fakes"
	"github.com/broadcastd/broadcast/internal/gateway"
)

// Hit is one recipient of one request as a provider fake received and
// answered it: the fakes' own ledger, which the checker judges by.
type Hit struct {
	// At is when the request arrived.
	At time.Time `json:"at"`
	// Call numbers the requests of one fake, so a batch call's recipients
	// share it.
	Call    int    `json:"call"`
	Account string `json:"account"`
	Task    string `json:"task"`
	To      string `json:"to"`
	// Key is the Idempotency-Key, where the protocol has one.
	Key     string `json:"key,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Status is the answer for this recipient (an HTTP status; for
	// per-recipient codes, 200 or the code's HTTP equivalent).
	Status   int  `json:"status"`
	Accepted bool `json:"accepted"`
	// GaveUp is true when the client had gone before the answer was
	// written: the send's outcome was unknown to the sender.
	GaveUp bool `json:"gave_up,omitempty"`
}

// Fake is a provider stand-in for one account.
type Fake interface {
	// URL is the endpoint the account points at (for SMTP, host:port).
	URL() string
	// Hits returns everything received so far, in arrival order.
	Hits() []Hit
	// Close stops it.
	Close()
}

// hits is the shared bookkeeping of the fakes.
type hits struct {
	mu    sync.Mutex
	calls int
	list  []Hit
}

func (h *hits) nextCall() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	return h.calls
}

func (h *hits) add(hs ...Hit) {
	h.mu.Lock()
	h.list = append(h.list, hs...)
	h.mu.Unlock()
}

// Hits returns a copy of the recorded hits.
func (h *hits) Hits() []Hit {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Hit(nil), h.list...)
}

// draw is a reproducible number in [0, 1) for a request.
func draw(seed uint64, parts ...string) float64 {
	h := uint64(14695981039346656037)
	for i := range 8 {
		h = (h ^ (seed >> (8 * i) & 0xff)) * 1099511628211
	}
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			h = (h ^ uint64(p[i])) * 1099511628211
		}
		h = (h ^ 0xff) * 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) * 0x1p-53
}

// taskOf reads the task id the runner's templates start every body with:
// "[<task>] ...".
func taskOf(body string) string {
	if !strings.HasPrefix(body, "[") {
		return ""
	}
	end := strings.IndexByte(body, ']')
	if end < 0 {
		return ""
	}
	return body[1:end]
}

// webhookFake is internal/gateway behind a recorder that also answers a
// share of requests late: it waits past the client's timeout before handing
// the request to the gateway, which then decides and records it.
type webhookFake struct {
	hits
	srv  *httptest.Server
	gw   *gateway.Gateway
	late float64
	wait time.Duration
	seed uint64
}

func newWebhookFake(seed uint64, a Account, tape *gateway.Tape) (*webhookFake, error) {
	f := a.Faults
	cfg := gateway.Config{
		FailRate:        f.FailRate,
		RateLimitedRate: f.RateLimitedRate,
		TimeoutRate:     f.TimeoutRate,
		Hang:            a.Timeout + 500*time.Millisecond,
		Latency:         f.Latency,
		PermanentPrefix: "bad-",
		RatePerSec:      f.CapacityPerSec,
		Burst:           max(1, a.Burst),
		Unauthorized:    f.Unauthorized,
		NoRetryAfter:    f.NoRetryAfter,
		Tape:            tape,
		Seed:            seed | 1,
	}
	g, err := gateway.New(cfg)
	if err != nil {
		return nil, err
	}
	w := &webhookFake{gw: g, late: f.LateRate, wait: a.Timeout + 100*time.Millisecond, seed: seed}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	return w, nil
}

func (w *webhookFake) URL() string { return w.srv.URL + "/send" }
func (w *webhookFake) Close()      { w.srv.CloseClientConnections(); w.srv.Close() }

func (w *webhookFake) serve(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.gw.ServeHTTP(rw, r)
		return
	}
	h := Hit{At: time.Now(), Call: w.nextCall(), Key: r.Header.Get("Idempotency-Key")}
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		TaskID  string `json:"task_id"`
		To      string `json:"to"`
		Account string `json:"account"`
		Attempt int    `json:"attempt"`
		Body    string `json:"body"`
	}
	_ = json.Unmarshal(raw, &body)
	h.Task, h.To, h.Account, h.Attempt = body.TaskID, body.To, body.Account, body.Attempt
	if w.late > 0 && draw(w.seed, "late", h.Key, fmt.Sprint(h.Attempt)) < w.late {
		time.Sleep(w.wait)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	sw := &fakes.StatusRecorder{ResponseWriter: rw, Status: http.StatusOK}
	w.gw.ServeHTTP(sw, r)
	h.Status = sw.Status
	h.Accepted = sw.Status/100 == 2
	h.GaveUp = r.Context().Err() != nil
	// A digest carries the items of several tasks, one a line, each
	// starting "[<task>]": the request is a hit of each of them (one
	// call, the carrier's key).
	for _, task := range digestTasks(body.Body, h.Task) {
		d := h
		d.Task = task
		w.add(d)
	}
}

// digestTasks are the tasks whose items a body carries: the carrier's,
// and those of every line that starts "[<task>]".
func digestTasks(body, carrier string) []string {
	out := []string{carrier}
	for line := range strings.SplitSeq(body, "\n") {
		if t := taskOf(line); t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// httpFake is the common part of the WxPusher and WhatsApp stand-ins: a
// server whose handler decides per request from the account's faults.
type httpFake struct {
	hits
	srv     *httptest.Server
	seed    uint64
	account Account
	// tokens and last are the provider's own token bucket
	// (Faults.CapacityPerSec, as large as the account's burst).
	mu     sync.Mutex
	tokens float64
	last   time.Time
	seen   map[string]int // requests per recipient, for reproducible draws
}

func (f *httpFake) URL() string { return f.srv.URL }
func (f *httpFake) Close()      { f.srv.CloseClientConnections(); f.srv.Close() }

// overCapacity takes a token from the provider's bucket; false when it has
// none (the request is refused with a rate-limit answer).
func (f *httpFake) overCapacity(now time.Time) bool {
	c := f.account.Faults.CapacityPerSec
	if c <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	burst := float64(max(1, f.account.Burst))
	if f.last.IsZero() {
		f.tokens = burst
	} else {
		f.tokens = min(burst, f.tokens+now.Sub(f.last).Seconds()*c)
	}
	f.last = now
	if f.tokens < 1 {
		return true
	}
	f.tokens--
	return false
}

// attempt counts the requests for one recipient of one task.
func (f *httpFake) attempt(task, to string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[string]int{}
	}
	f.seen[task+"\x00"+to]++
	return f.seen[task+"\x00"+to]
}

// callFault is a call-level fault: "", "5xx", "429", "timeout", "late".
func (f *httpFake) callFault(parts ...string) string {
	fl := f.account.Faults
	u := draw(f.seed, parts...)
	switch {
	case u < fl.FailRate:
		return "5xx"
	case u < fl.FailRate+fl.RateLimitedRate:
		return "429"
	case u < fl.FailRate+fl.RateLimitedRate+fl.TimeoutRate:
		return "timeout"
	case u < fl.FailRate+fl.RateLimitedRate+fl.TimeoutRate+fl.LateRate:
		return "late"
	}
	return ""
}

// hang waits past the client's timeout, or until it gives up.
func (f *httpFake) hang(r *http.Request) {
	select {
	case <-time.After(f.account.Timeout + 500*time.Millisecond):
	case <-r.Context().Done():
	}
}

// wxpusherFake speaks WxPusher's send API: one call carries many uids,
// each answered with its own code. "UID_bad..." uids answer 1001
// (permanent).
func newWxPusherFake(seed uint64, a Account, token string) *httpFake {
	f := &httpFake{seed: seed, account: a}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		call := f.nextCall()
		var req struct {
			AppToken string   `json:"appToken"`
			Content  string   `json:"content"`
			UIDs     []string `json:"uids"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		task := taskOf(req.Content)
		if a.Faults.Latency > 0 {
			time.Sleep(a.Faults.Latency)
		}
		record := func(status int, accepted func(uid string) bool) {
			var hs []Hit
			for _, u := range req.UIDs {
				hs = append(hs, Hit{At: at, Call: call, Account: a.Name, Task: task, To: u, Status: status,
					Accepted: accepted(u), GaveUp: r.Context().Err() != nil})
			}
			f.add(hs...)
		}
		none := func(string) bool { return false }
		if r.URL.Path != "/api/send/message" || req.AppToken != token || a.Faults.Unauthorized {
			record(http.StatusUnauthorized, none)
			fmt.Fprint(w, `{"code":1001,"msg":"appToken错误","success":false}`)
			return
		}
		if f.overCapacity(at) {
			record(http.StatusTooManyRequests, none)
			fmt.Fprint(w, `{"code":1008,"msg":"发送频率过快","success":false}`)
			return
		}
		n := 0
		if len(req.UIDs) > 0 {
			n = f.attempt(task, req.UIDs[0])
		}
		first := ""
		if len(req.UIDs) > 0 {
			first = req.UIDs[0]
		}
		switch f.callFault(task, first, fmt.Sprint(n), fmt.Sprint(len(req.UIDs))) {
		case "5xx":
			record(http.StatusServiceUnavailable, none)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case "429":
			record(http.StatusTooManyRequests, none)
			if !a.Faults.NoRetryAfter {
				w.Header().Set("Retry-After", "1")
			}
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case "timeout":
			f.hang(r)
			record(http.StatusGatewayTimeout, none)
			return
		case "late":
			f.hang(r)
		}
		var data []string
		ok := func(u string) bool { return !strings.HasPrefix(u, "UID_bad") }
		for i, u := range req.UIDs {
			code := 1000
			if !ok(u) {
				code = 1001
			}
			data = append(data, fmt.Sprintf(`{"uid":%q,"code":%d,"status":"ok","messageId":%d,"sendRecordId":%d}`, u, code, call, call*10000+i))
		}
		record(http.StatusOK, ok)
		fmt.Fprintf(w, `{"code":1000,"msg":"处理成功","data":[%s],"success":true}`, strings.Join(data, ","))
	}))
	return f
}

var waPath = regexp.MustCompile(`^/v[0-9.]+/([0-9]+)/messages$`)

// newWhatsAppFake speaks the Graph API's messages endpoint. Numbers
// starting +86139 answer 131026 (undeliverable, permanent); rate limits
// answer 130429.
func newWhatsAppFake(seed uint64, a Account, token, phoneID string) *httpFake {
	f := &httpFake{seed: seed, account: a}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		call := f.nextCall()
		var req struct {
			To   string `json:"to"`
			Text struct {
				Body string `json:"body"`
			} `json:"text"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		h := Hit{At: at, Call: call, Account: a.Name, Task: taskOf(req.Text.Body), To: req.To}
		answer := func(status int, body string) {
			h.Status = status
			h.GaveUp = r.Context().Err() != nil
			f.add(h)
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
		if a.Faults.Latency > 0 {
			time.Sleep(a.Faults.Latency)
		}
		m := waPath.FindStringSubmatch(r.URL.Path)
		if m == nil || m[1] != phoneID || r.Header.Get("Authorization") != "Bearer "+token || a.Faults.Unauthorized {
			answer(http.StatusUnauthorized, `{"error":{"message":"Invalid OAuth access token","type":"OAuthException","code":190}}`)
			return
		}
		if f.overCapacity(at) {
			answer(http.StatusBadRequest, `{"error":{"message":"throughput reached","type":"OAuthException","code":130429}}`)
			return
		}
		h.Attempt = f.attempt(h.Task, req.To)
		switch f.callFault(h.Task, req.To, fmt.Sprint(h.Attempt)) {
		case "5xx":
			answer(http.StatusInternalServerError, `{"error":{"message":"Something went wrong","type":"OAuthException","code":131000}}`)
			return
		case "429":
			if !a.Faults.NoRetryAfter {
				w.Header().Set("Retry-After", "1")
			}
			answer(http.StatusTooManyRequests, `{"error":{"message":"Too many messages","type":"OAuthException","code":130429}}`)
			return
		case "timeout":
			f.hang(r)
			h.Status = http.StatusGatewayTimeout
			h.GaveUp = true
			f.add(h)
			return
		case "late":
			f.hang(r)
		}
		if strings.HasPrefix(req.To, "+86139") {
			answer(http.StatusBadRequest, `{"error":{"message":"Message undeliverable","type":"OAuthException","code":131026}}`)
			return
		}
		h.Accepted = true
		answer(http.StatusOK, fmt.Sprintf(`{"messaging_product":"whatsapp","contacts":[{"input":%q,"wa_id":"x"}],"messages":[{"id":"wamid.%d"}]}`, req.To, call))
	}))
	return f
}

// smtpFake is an SMTP stand-in (fakes.SMTP): "bad..." mailboxes answer
// 550, a share of transactions answers 451 (retryable) from the account's
// FailRate. Half the seeds' servers offer PIPELINING (odd seeds do not)
// and half CHUNKING (seeds with bit 1 set do not), so each of the
// sender's transactions (serial, pipelined DATA, BDAT) meets every
// scenario.
type smtpFake struct {
	hits
	srv     *fakes.SMTP
	seed    uint64
	account Account
	mu      sync.Mutex
	seen    map[string]int // transactions per task and first recipient, for reproducible draws
}

func newSMTPFake(seed uint64, a Account) (*smtpFake, error) {
	s := &smtpFake{seed: seed, account: a, seen: map[string]int{}}
	srv, err := fakes.StartSMTP(fakes.SMTPConfig{Rcpt: s.rcpt, Data: s.data, NoPipelining: seed%2 == 1, NoChunking: seed/2%2 == 1})
	if err != nil {
		return nil, err
	}
	s.srv = srv
	return s, nil
}

func (s *smtpFake) URL() string { return s.srv.Addr() }

func (s *smtpFake) Close() { s.srv.Close() }

// rcpt refuses "bad..." mailboxes, recording the refusal.
func (s *smtpFake) rcpt(addr string) string {
	if !strings.HasPrefix(addr, "bad") {
		return ""
	}
	s.add(Hit{At: time.Now(), Call: s.nextCall(), Account: s.account.Name, To: addr, Status: 550})
	return "550 5.1.1 mailbox unavailable"
}

// data answers a message 250 or, by a draw against FailRate, 451, and
// records it for every recipient.
func (s *smtpFake) data(m fakes.Mail) string {
	task := ""
	if i := bytes.Index(m.Data, []byte("\n[")); i >= 0 {
		task = taskOf(string(m.Data[i+1:]))
	} else if i := bytes.Index(m.Data, []byte("[")); i >= 0 {
		task = taskOf(string(m.Data[i:]))
	}
	call := s.nextCall()
	s.mu.Lock()
	n := 0
	if len(m.To) > 0 {
		s.seen[task+m.To[0]]++
		n = s.seen[task+m.To[0]]
	}
	s.mu.Unlock()
	status := 250
	if len(m.To) > 0 && draw(s.seed, "smtp", task, m.To[0], fmt.Sprint(n)) < s.account.Faults.FailRate {
		status = 451
	}
	for _, a := range m.To {
		s.add(Hit{At: m.At, Call: call, Account: s.account.Name, Task: task, To: a, Status: status, Accepted: status == 250})
	}
	if status == 451 {
		return "451 4.3.0 try again later"
	}
	return ""
}
