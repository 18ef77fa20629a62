package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/logtest"
)

// bundle is what setup gives a test: a gateway behind a real HTTP server.
type bundle struct {
	g      *Gateway
	srv    *httptest.Server
	client *http.Client
	secret string
}

func setup(t testing.TB, cfg Config) *bundle {
	t.Helper()
	g, err := New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	return &bundle{g: g, srv: srv, client: client, secret: cfg.Secret}
}

// answer is what a test keeps of a response.
type answer struct {
	status     int
	retryAfter string
	body       string
}

// msg builds the webhook body for key.
func msg(key, to, account string, attempt int) message {
	return message{ID: key, TaskID: "task-1", To: to, Body: "hello " + to, Account: account, Attempt: attempt}
}

func sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return signaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// send posts m as the webhook channel does, signed when the bundle has a
// secret. It fails the test on a transport error, so call it only from the
// test's goroutine; workers use trySend.
func (b *bundle) send(t testing.TB, m message) answer {
	t.Helper()
	a, err := b.trySend(m)
	require.NoError(t, err)
	return a
}

// trySend is send for any goroutine.
func (b *bundle) trySend(m message) (answer, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return answer{}, err
	}
	h := http.Header{"Content-Type": {"application/json"}, headerIdempotencyKey: {m.ID}}
	if b.secret != "" {
		h.Set(headerSignature, sign(b.secret, raw))
	}
	return b.tryPost("/send", raw, h)
}

// post sends raw to path with headers h, from the test's goroutine.
func (b *bundle) post(t testing.TB, path string, raw []byte, h http.Header) answer {
	t.Helper()
	a, err := b.tryPost(path, raw, h)
	require.NoError(t, err)
	return a
}

// tryPost is post for any goroutine.
func (b *bundle) tryPost(path string, raw []byte, h http.Header) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, bytes.NewReader(raw))
	if err != nil {
		return answer{}, err
	}
	req.Header = h
	resp, err := b.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(body)}, nil
}

// tally counts answers by status from many goroutines.
type tally struct {
	mu       sync.Mutex
	statuses map[int]int
}

func (c *tally) add(t *testing.T, a answer, err error) {
	if err != nil {
		t.Error(err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.statuses == nil {
		c.statuses = make(map[int]int)
	}
	c.statuses[a.status]++
}

// checkInvariants asserts the bookkeeping identities every ledger obeys.
func checkInvariants(t *testing.T, l Ledger) {
	t.Helper()
	sumReq, sumAcc, dups := 0, 0, 0
	for _, n := range l.RequestsByKey {
		sumReq += n
	}
	for _, n := range l.AcceptedByKey {
		sumAcc += n
		dups += max(n-1, 0)
	}
	require.Equal(t, l.Requests, sumReq, "Requests vs sum of RequestsByKey")
	require.Equal(t, l.Accepted, sumAcc, "Accepted vs sum of AcceptedByKey")
	require.Equal(t, l.Duplicates, dups, "Duplicates vs AcceptedByKey")
	require.Equal(t, l.Requests, l.Accepted+l.Refused+l.InjectedTotal()+l.BadSignature+l.BadRequest, "outcomes vs Requests")
	perSecond := 0
	for acct, slots := range l.AcceptedPerSecond {
		for _, n := range slots {
			perSecond += n
		}
		require.LessOrEqual(t, l.MaxPerSecond[acct], l.Accepted)
		require.GreaterOrEqual(t, l.MaxPerSecond[acct], maxOf(slots), "MaxPerSecond below a fixed second of %s", acct)
	}
	require.Equal(t, l.Accepted, perSecond, "Accepted vs AcceptedPerSecond")
	require.Len(t, l.Bodies, len(l.AcceptedByKey))
}

// maxOf returns the largest element of s.
func maxOf(s []int) int {
	m := 0
	for _, v := range s {
		m = max(m, v)
	}
	return m
}

// parallel runs n calls of f spread over workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func TestSignature(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-value"
	b := setup(t, Config{Secret: secret})
	m := msg("k1", "+4912345", "acct", 1)
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	other, err := json.Marshal(msg("k1", "+4999999", "acct", 1))
	require.NoError(t, err)

	tests := []struct {
		name   string
		sig    string
		status int
	}{
		{"good", sign(secret, raw), http.StatusOK},
		{"missing", "", http.StatusUnauthorized},
		{"wrong secret", sign("other", raw), http.StatusUnauthorized},
		{"other body", sign(secret, other), http.StatusUnauthorized},
		{"no prefix", strings.TrimPrefix(sign(secret, raw), signaturePrefix), http.StatusUnauthorized},
		{"sha1 prefix", "sha1=" + strings.TrimPrefix(sign(secret, raw), signaturePrefix), http.StatusUnauthorized},
		{"not hex", "sha256=zz", http.StatusUnauthorized},
		{"truncated", sign(secret, raw)[:20], http.StatusUnauthorized},
	}
	for _, tc := range tests {
		h := http.Header{"Content-Type": {"application/json"}, headerIdempotencyKey: {"k1"}}
		if tc.sig != "" {
			h.Set(headerSignature, tc.sig)
		}
		a := b.post(t, "/send", raw, h)
		require.Equal(t, tc.status, a.status, tc.name)
		require.NotContains(t, a.body, secret, tc.name)
	}
	l := b.g.Ledger()
	require.Equal(t, len(tests), l.Requests)
	require.Equal(t, 1, l.Accepted)
	require.Equal(t, len(tests)-1, l.BadSignature)
	require.Zero(t, l.BadRequest)
	require.Zero(t, l.Injected["401"], "bad signatures are not injected faults")
	checkInvariants(t, l)

	// Without a Secret, signatures are not checked at all.
	open := setup(t, Config{})
	h := http.Header{headerIdempotencyKey: {"k1"}, headerSignature: {"sha256=00"}}
	require.Equal(t, http.StatusOK, open.post(t, "/send", raw, h).status)
}

func TestFaultRates(t *testing.T) {
	t.Parallel()
	const n = 2000
	cfg := Config{FailRate: 0.2, RateLimitedRate: 0.1, TimeoutRate: 0.05, Hang: time.Millisecond, Seed: 42}
	b := setup(t, cfg)
	var c tally
	parallel(n, 16, func(i int) {
		a, err := b.trySend(msg(fmt.Sprintf("key-%d", i), "+49"+strconv.Itoa(i), "acct", 1))
		c.add(t, a, err)
	})
	statuses := c.statuses

	want := map[int]float64{
		http.StatusServiceUnavailable: cfg.FailRate,
		http.StatusTooManyRequests:    cfg.RateLimitedRate,
		http.StatusGatewayTimeout:     cfg.TimeoutRate,
		http.StatusOK:                 1 - cfg.FailRate - cfg.RateLimitedRate - cfg.TimeoutRate,
	}
	total := 0
	for status, p := range want {
		// Four binomial standard deviations: a broken draw misses by far more.
		tol := 4 * math.Sqrt(n*p*(1-p))
		require.InDelta(t, n*p, statuses[status], tol, "status %d: got %d of %d", status, statuses[status], n)
		total += statuses[status]
	}
	require.Equal(t, n, total, "unexpected statuses: %v", statuses)

	l := b.g.Ledger()
	require.Equal(t, n, l.Requests)
	require.Equal(t, statuses[http.StatusOK], l.Accepted)
	require.Equal(t, statuses[http.StatusServiceUnavailable], l.Injected["503"])
	require.Equal(t, statuses[http.StatusTooManyRequests], l.Injected["429"])
	require.Equal(t, statuses[http.StatusGatewayTimeout], l.Injected["504"])
	require.Zero(t, l.Refused)
	require.Equal(t, l.Accepted, l.AcceptedKeys())
	checkInvariants(t, l)
}

func TestSeedDeterminism(t *testing.T) {
	t.Parallel()
	cfg := Config{FailRate: 0.3, RateLimitedRate: 0.2, TimeoutRate: 0.1, Hang: time.Millisecond, Seed: 7}
	const n = 300
	run := func(cfg Config, attempt int, reverse bool) []int {
		b := setup(t, cfg)
		out := make([]int, n)
		parallel(n, 8, func(i int) {
			if reverse {
				i = n - 1 - i
			}
			a, err := b.trySend(msg(fmt.Sprintf("key-%d", i), "+1", "acct", attempt))
			if err != nil {
				t.Error(err)
			}
			out[i] = a.status
		})
		return out
	}
	first := run(cfg, 1, false)
	require.Equal(t, first, run(cfg, 1, true), "same seed, keys and attempts must give the same answers in any order")

	differs := func(a, b []int) int {
		d := 0
		for i := range a {
			if a[i] != b[i] {
				d++
			}
		}
		return d
	}
	other := cfg
	other.Seed = 8
	require.Greater(t, differs(first, run(other, 1, false)), n/10, "another seed must give other answers")
	require.Greater(t, differs(first, run(cfg, 2, false)), n/10, "another attempt must give an independent draw")

	// The hash is pinned, so a seeded run recorded today replays tomorrow.
	require.Equal(t, uint64(0x5bb9bb8a0d068ab1), hashDecision(7, "key-0", 1))
	require.Equal(t, uint64(0x82e153af9f768432), hashDecision(42, "a", 3))
	require.NotEqual(t, hashDecision(7, "key-01", 1), hashDecision(7, "key-0", 11), "key and attempt must not run together")
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{RatePerSec: 50, Burst: 5})
	const n = 200
	var c tally
	start := time.Now()
	parallel(n, 8, func(i int) {
		a, err := b.trySend(msg(fmt.Sprintf("key-%d", i), "+1", "acct-a", 1))
		if err == nil && a.status == http.StatusTooManyRequests && a.retryAfter != "1" {
			t.Errorf("refusal %d: Retry-After %q, want 1", i, a.retryAfter)
		}
		c.add(t, a, err)
	})
	elapsed := time.Since(start)
	statuses := c.statuses

	l := b.g.Ledger()
	require.Equal(t, n, l.Requests)
	require.Equal(t, n, l.Accepted+l.Refused, "statuses: %v", statuses)
	require.Equal(t, statuses[http.StatusOK], l.Accepted)
	require.Equal(t, statuses[http.StatusTooManyRequests], l.Refused)
	require.Positive(t, l.Refused)
	require.GreaterOrEqual(t, l.Accepted, 5, "the burst must get through")
	// Burst plus what refills while the requests were sent.
	require.LessOrEqual(t, float64(l.Accepted), 5+50*elapsed.Seconds()+1)
	slots := l.AcceptedPerSecond["acct-a"]
	require.NotEmpty(t, slots)
	require.LessOrEqual(t, slots[0], 55, "first second")
	require.LessOrEqual(t, l.MaxPerSecond["acct-a"], 55)
	require.GreaterOrEqual(t, l.MaxPerSecond["acct-a"], slots[0])
	require.Zero(t, l.InjectedTotal(), "refused requests are not fault-injected")
	checkInvariants(t, l)

	// Buckets are per account: a fresh account gets its whole burst.
	for i := range 5 {
		require.Equal(t, http.StatusOK, b.send(t, msg(fmt.Sprintf("b-%d", i), "+1", "acct-b", 1)).status, "request %d of acct-b", i)
	}
}

// fakeClock drives g.now by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Duration
}

func (c *fakeClock) set(d time.Duration) { c.mu.Lock(); c.now = d; c.mu.Unlock() }
func (c *fakeClock) get() time.Duration  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func TestRateLimitFakeClock(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{RatePerSec: 2, Burst: 2})
	clock := &fakeClock{}
	b.g.now = clock.get
	steps := []struct {
		at     time.Duration
		status int
	}{
		{0, http.StatusOK}, {0, http.StatusOK}, {0, http.StatusTooManyRequests}, // burst of 2
		{250 * time.Millisecond, http.StatusTooManyRequests},               // 0.5 tokens
		{750 * time.Millisecond, http.StatusOK},                            // 1.5 tokens
		{800 * time.Millisecond, http.StatusTooManyRequests},               // 0.6 tokens
		{1200 * time.Millisecond, http.StatusOK},                           // 1.4 tokens
		{5 * time.Second, http.StatusOK}, {5 * time.Second, http.StatusOK}, // refilled, capped at 2
		{5 * time.Second, http.StatusTooManyRequests},
	}
	// The clock starts off a second boundary: slots count from the first
	// acceptance, not from the gateway's start.
	const offset = 300 * time.Millisecond
	for i, s := range steps {
		clock.set(s.at + offset)
		a := b.send(t, msg(fmt.Sprintf("key-%d", i), "+1", "acct", 1))
		require.Equal(t, s.status, a.status, "step %d at %v", i, s.at)
	}
	l := b.g.Ledger()
	require.Equal(t, 6, l.Accepted)
	require.Equal(t, 4, l.Refused)
	require.Equal(t, []int{3, 1, 0, 0, 0, 2}, l.AcceptedPerSecond["acct"])
	require.Equal(t, 3, l.MaxPerSecond["acct"])

	// The bucket comes before fault injection: a faulted request spends a
	// token, and a refused one is never faulted.
	faulty := setup(t, Config{RatePerSec: 0.001, FailRate: 1})
	require.Equal(t, http.StatusServiceUnavailable, faulty.send(t, msg("f1", "+1", "acct", 1)).status)
	require.Equal(t, http.StatusTooManyRequests, faulty.send(t, msg("f2", "+1", "acct", 1)).status)
	fl := faulty.g.Ledger()
	require.Equal(t, 1, fl.Refused)
	require.Equal(t, 1, fl.Injected["503"])
	require.Zero(t, fl.Injected["429"])

	// A slow bucket advertises the wait for its next token, not just RetryAfter.
	slow := setup(t, Config{RatePerSec: 0.1})
	require.Equal(t, http.StatusOK, slow.send(t, msg("s1", "+1", "acct", 1)).status)
	a := slow.send(t, msg("s2", "+1", "acct", 1))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, "10", a.retryAfter)
}

func TestMaxPerSecondWindow(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	var a accountStats
	// Times are offset so slots must count from the first acceptance.
	for _, at := range []time.Duration{0, 500 * ms, 990 * ms, 1000 * ms, 1600 * ms, 3000 * ms} {
		a.accept(at + 700*ms)
	}
	require.Equal(t, []int{3, 2, 0, 1}, a.perSecond)
	require.Equal(t, 3, a.maxPerSecond, "a window is shorter than one second: 0 and 1.0 never share one")

	// Against brute force, over enough times to exercise compaction.
	r := rand.New(rand.NewPCG(1, 2))
	var b accountStats
	times := make([]time.Duration, 5000)
	var now time.Duration
	for i := range times {
		if r.IntN(3) > 0 {
			now += time.Duration(r.IntN(int(2 * ms)))
		}
		if r.IntN(500) == 0 {
			now += 2 * time.Second
		}
		times[i] = now
		b.accept(now)
	}
	want := 0
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j]-times[i] < time.Second; j++ {
			n++
		}
		want = max(want, n)
	}
	require.Equal(t, want, b.maxPerSecond)
	require.Less(t, len(b.window), len(times), "the window must not keep every timestamp")
}

func TestDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{PermanentPrefix: "bad:"})
	for i := range 3 {
		m := msg("dup", "+1", "acct", i+1)
		m.Body = fmt.Sprintf("body %d", i)
		a := b.send(t, m)
		require.Equal(t, http.StatusOK, a.status, "a duplicate is still answered 2xx")
		var got struct{ ID string }
		require.NoError(t, json.Unmarshal([]byte(a.body), &got))
		require.NotEmpty(t, got.ID)
	}
	require.Equal(t, http.StatusOK, b.send(t, msg("once", "+2", "acct", 1)).status)
	require.Equal(t, http.StatusBadRequest, b.send(t, msg("never", "bad:3", "acct", 1)).status)
	require.Equal(t, http.StatusBadRequest, b.send(t, msg("never", "bad:3", "acct", 2)).status)

	l := b.g.Ledger()
	require.Equal(t, 6, l.Requests)
	require.Equal(t, 4, l.Accepted)
	require.Equal(t, 2, l.Duplicates)
	require.Equal(t, map[string]int{"dup": 3, "once": 1}, l.AcceptedByKey)
	require.Equal(t, map[string]int{"dup": 3, "once": 1, "never": 2}, l.RequestsByKey)
	require.Equal(t, 2, l.AcceptedKeys())
	require.Equal(t, map[string]string{"dup": "body 2", "once": "hello +2"}, l.Bodies)
	require.Equal(t, 2, l.Injected["400"])
	checkInvariants(t, l)
}

func TestRetryAfterOnInjected429(t *testing.T) {
	t.Parallel()
	tests := []struct {
		retryAfter time.Duration
		want       string
	}{
		{0, "1"}, // default
		{300 * time.Millisecond, "1"},
		{2500 * time.Millisecond, "3"},
		{7 * time.Second, "7"},
	}
	for _, tc := range tests {
		b := setup(t, Config{RateLimitedRate: 1, RetryAfter: tc.retryAfter})
		a := b.send(t, msg("k", "+1", "acct", 1))
		require.Equal(t, http.StatusTooManyRequests, a.status)
		require.Equal(t, tc.want, a.retryAfter, "RetryAfter %v", tc.retryAfter)
		l := b.g.Ledger()
		require.Equal(t, 1, l.Injected["429"])
		require.Zero(t, l.Refused, "injected 429s are not refusals")
	}
}

// TestStorm: during a storm every send request gets 429 with Retry-After,
// counted as an injected 429 and taking no bucket token; before and after
// it the gateway answers as configured.
func TestStorm(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{RatePerSec: 1, Burst: 1, RetryAfter: 2 * time.Second})
	clock := &fakeClock{}
	b.g.now = clock.get
	b.g.Storm(5 * time.Second)
	for i, at := range []time.Duration{0, time.Second, 4999 * time.Millisecond} {
		clock.set(at)
		a := b.send(t, msg(fmt.Sprintf("s%d", i), "+1", "acct", 1))
		require.Equal(t, http.StatusTooManyRequests, a.status, "at %s", at)
		require.Equal(t, "2", a.retryAfter)
	}
	clock.set(5 * time.Second)
	require.Equal(t, http.StatusOK, b.send(t, msg("after", "+1", "acct", 1)).status, "the bucket is untouched by the storm")
	l := b.g.Ledger()
	require.Equal(t, 3, l.Injected["429"])
	require.Zero(t, l.Refused)
	require.Equal(t, 1, l.Accepted)
	require.Equal(t, l.Requests, l.Accepted+l.Refused+l.InjectedTotal()+l.BadSignature+l.BadRequest)

	// A storm can be ended early, and started over HTTP.
	b.g.Storm(time.Hour)
	b.g.Storm(0)
	require.Equal(t, http.StatusOK, b.send(t, msg("ended", "+1", "acct2", 1)).status)
	require.Equal(t, http.StatusNoContent, b.post(t, "/storm?for=10s", nil, nil).status)
	require.Equal(t, http.StatusTooManyRequests, b.send(t, msg("http", "+1", "acct3", 1)).status)
	require.Equal(t, http.StatusBadRequest, b.post(t, "/storm?for=soon", nil, nil).status)
}

func TestOmitInjectedRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{RateLimitedRate: 1, OmitInjectedRetryAfter: true})
	a := b.send(t, msg("k", "+1", "acct", 1))
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Empty(t, a.retryAfter)
	// Refusals for exceeding the rate still carry it.
	r := setup(t, Config{RatePerSec: 0.001, OmitInjectedRetryAfter: true})
	r.send(t, msg("a", "+1", "acct", 1))
	require.Equal(t, "1000", r.send(t, msg("b", "+1", "acct", 1)).retryAfter)
}

func TestPrefixes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{PermanentPrefix: "x", FatalPrefix: "xfatal:", FailRate: 1})
	tests := []struct {
		to     string
		status int
	}{
		{"xfatal:1", http.StatusUnauthorized}, // both match: fatal wins
		{"x123", http.StatusBadRequest},
		{"+49x", http.StatusServiceUnavailable}, // only a prefix counts; then FailRate
		{"fatal:1", http.StatusServiceUnavailable},
	}
	for i, tc := range tests {
		a := b.send(t, msg(fmt.Sprintf("k%d", i), tc.to, "acct", 1))
		require.Equal(t, tc.status, a.status, tc.to)
	}
	l := b.g.Ledger()
	require.Equal(t, map[string]int{"400": 1, "401": 1, "503": 2, "429": 0, "504": 0}, l.Injected)
	require.Zero(t, l.BadSignature)
	checkInvariants(t, l)
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	good, err := json.Marshal(msg("k", "+1", "acct", 1))
	require.NoError(t, err)
	noID, _ := json.Marshal(msg("", "+1", "acct", 1))
	noTo, _ := json.Marshal(msg("k", "", "acct", 1))
	longTo, _ := json.Marshal(msg("k", strings.Repeat("9", maxRecipientBytes+1), "acct", 1))
	huge, _ := json.Marshal(message{ID: "k", To: "+1", Body: strings.Repeat("a", maxBodyBytes)})
	keyed := http.Header{headerIdempotencyKey: {"k"}}
	tests := []struct {
		name   string
		raw    []byte
		h      http.Header
		status int
	}{
		{"not json", []byte("{"), keyed, http.StatusBadRequest},
		{"json array", []byte("[]"), keyed, http.StatusBadRequest},
		{"no id", noID, http.Header{headerIdempotencyKey: {""}}, http.StatusBadRequest},
		{"no to", noTo, keyed, http.StatusBadRequest},
		{"to too long", longTo, keyed, http.StatusBadRequest},
		{"no key header", good, http.Header{}, http.StatusBadRequest},
		{"key differs", good, http.Header{headerIdempotencyKey: {"other"}}, http.StatusBadRequest},
		{"too large", huge, keyed, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		a := b.post(t, "/send", tc.raw, tc.h)
		require.Equal(t, tc.status, a.status, tc.name)
		require.Contains(t, a.body, `"error"`, tc.name)
	}
	l := b.g.Ledger()
	require.Equal(t, len(tests), l.Requests)
	require.Equal(t, len(tests), l.BadRequest)
	require.Zero(t, l.Accepted)
	require.Equal(t, 2, l.RequestsByKey[""], "keyless requests count under the empty key")
	checkInvariants(t, l)
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	raw, err := json.Marshal(msg("k", "+1", "acct", 1))
	require.NoError(t, err)
	h := http.Header{headerIdempotencyKey: {"k"}}
	for _, path := range []string{"/send", "/", "/v1/accounts/acct/send", "/hooks/send"} {
		require.Equal(t, http.StatusOK, b.post(t, path, raw, h).status, path)
	}
	require.Equal(t, http.StatusNotFound, b.post(t, "/sender", raw, h).status)
	require.Equal(t, http.StatusMethodNotAllowed, b.post(t, "/ledger", nil, nil).status)

	for path, want := range map[string]int{"/send": 405, "/": 405, "/healthz": 200, "/reset": 405, "/nope": 404} {
		resp, err := b.client.Get(b.srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "GET %s", path)
	}
	l := b.g.Ledger()
	require.Equal(t, 4, l.Requests, "only POSTs to send paths are requests")
	require.Equal(t, 3, l.Duplicates)
}

func TestLedgerJSONRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FailRate: 0.3, RateLimitedRate: 0.2, PermanentPrefix: "bad", Seed: 3})
	for i := range 40 {
		to := "+" + strconv.Itoa(i)
		if i%7 == 0 {
			to = "bad" + to
		}
		b.send(t, msg(fmt.Sprintf("k%d", i%25), to, fmt.Sprintf("acct-%d", i%3), 1))
	}
	ctx := t.Context()
	got, err := FetchLedger(ctx, b.srv.URL+"/")
	require.NoError(t, err)
	want := b.g.Ledger()
	require.Equal(t, want, got)
	require.Positive(t, got.Accepted)
	require.Positive(t, got.Duplicates)
	require.Len(t, got.AcceptedPerSecond, 3)

	// The JSON names are part of what scripts rely on.
	resp, err := b.client.Get(b.srv.URL + "/ledger")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var fields map[string]json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&fields))
	for _, name := range []string{"requests", "accepted", "accepted_by_key", "requests_by_key", "duplicates", "refused",
		"injected", "bad_signature", "bad_request", "accepted_per_second", "max_per_second", "bodies"} {
		require.Contains(t, fields, name)
	}

	require.NoError(t, ResetLedger(ctx, b.srv.URL))
	got, err = FetchLedger(ctx, b.srv.URL)
	require.NoError(t, err)
	require.Zero(t, got.Requests)
	require.Empty(t, got.RequestsByKey)
	require.Equal(t, map[string]int{"400": 0, "401": 0, "429": 0, "503": 0, "504": 0}, got.Injected)

	_, err = FetchLedger(ctx, b.srv.URL+"/nope")
	require.ErrorContains(t, err, "HTTP 404")
}

func TestConcurrentConsistency(t *testing.T) {
	t.Parallel()
	const secret = "concurrency"
	b := setup(t, Config{Secret: secret, FailRate: 0.1, RateLimitedRate: 0.1, PermanentPrefix: "bad", RatePerSec: 2000, Burst: 100})
	const workers, perWorker = 32, 100
	var c tally
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// Keys are shared between workers, so duplicates race.
				m := msg(fmt.Sprintf("k%d", (w*perWorker+i)%700), "+"+strconv.Itoa(i), fmt.Sprintf("acct-%d", w%4), i%3+1)
				if i%11 == 0 {
					m.To = "bad" + m.To
				}
				raw, _ := json.Marshal(m)
				h := http.Header{headerIdempotencyKey: {m.ID}, headerSignature: {sign(secret, raw)}}
				switch i % 17 {
				case 0:
					h.Set(headerSignature, sign("wrong", raw))
				case 1:
					h.Del(headerIdempotencyKey)
				}
				a, err := b.tryPost("/send", raw, h)
				c.add(t, a, err)
			}
		})
	}
	// Snapshots taken while requests run must be consistent too.
	var during []Ledger
	for range 20 {
		during = append(during, b.g.Ledger())
	}
	wg.Wait()
	for _, l := range during {
		checkInvariants(t, l)
	}
	statuses := c.statuses

	l := b.g.Ledger()
	require.Equal(t, workers*perWorker, l.Requests)
	checkInvariants(t, l)
	require.Equal(t, statuses[http.StatusOK], l.Accepted)
	require.Equal(t, statuses[http.StatusTooManyRequests], l.Refused+l.Injected["429"])
	require.Equal(t, statuses[http.StatusServiceUnavailable], l.Injected["503"])
	require.Equal(t, statuses[http.StatusUnauthorized], l.BadSignature)
	require.Equal(t, statuses[http.StatusBadRequest], l.BadRequest+l.Injected["400"])
	require.Positive(t, l.Duplicates)
	require.Positive(t, l.BadSignature)
	require.Positive(t, l.BadRequest)
}

func TestTimeoutAndLatency(t *testing.T) {
	t.Parallel()
	const hang = 300 * time.Millisecond
	b := setup(t, Config{TimeoutRate: 1, Hang: hang})
	start := time.Now()
	a := b.send(t, msg("k1", "+1", "acct", 1))
	require.Equal(t, http.StatusGatewayTimeout, a.status)
	require.GreaterOrEqual(t, time.Since(start), hang)

	// A client that gives up while the gateway hangs sees its own
	// cancellation; the ledger still has the request. It gives up once the
	// gateway counted it: a fixed 20 ms deadline sometimes ran out before
	// the request arrived, under the race detector in CI.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		defer cancel()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if b.g.Ledger().Injected["504"] == 2 {
				return
			}
		}
	}()
	raw, _ := json.Marshal(msg("k2", "+1", "acct", 1))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/send", bytes.NewReader(raw))
	req.Header.Set(headerIdempotencyKey, "k2")
	_, err := b.client.Do(req)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, b.g.Ledger().Injected["504"])

	slow := setup(t, Config{Latency: 50 * time.Millisecond})
	start = time.Now()
	require.Equal(t, http.StatusOK, slow.send(t, msg("k", "+1", "acct", 1)).status)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg   Config
		field string
	}{
		{Config{FailRate: -0.1}, "FailRate"},
		{Config{FailRate: math.NaN()}, "FailRate"},
		{Config{RateLimitedRate: 1.5}, "RateLimitedRate"},
		{Config{TimeoutRate: 2}, "TimeoutRate"},
		{Config{FailRate: 0.6, RateLimitedRate: 0.3, TimeoutRate: 0.2}, "FailRate+RateLimitedRate+TimeoutRate"},
		{Config{RetryAfter: -time.Second}, "RetryAfter"},
		{Config{Hang: -1}, "Hang"},
		{Config{Latency: -1}, "Latency"},
		{Config{RatePerSec: -1}, "RatePerSec"},
		{Config{RatePerSec: math.Inf(1)}, "RatePerSec"},
		{Config{Burst: -1}, "Burst"},
	}
	for _, tc := range tests {
		_, err := New(tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, tc.field)
		require.ErrorContains(t, err, tc.field+":")
	}

	g, err := New(Config{FailRate: 0.5, RateLimitedRate: 0.5})
	require.NoError(t, err, "rates summing to exactly 1 are valid")
	g, err = New(Config{})
	require.NoError(t, err)
	require.Equal(t, time.Second, g.cfg.RetryAfter)
	require.Equal(t, 15*time.Second, g.cfg.Hang)
	require.Equal(t, 1, g.cfg.Burst)
}

func TestSecretNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "do-not-print-me"
	cfg := Config{Secret: secret, Seed: 9}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("config", "config", cfg)
	log.Info("config", "ptr", &cfg)
	fmt.Fprintf(&buf, "%v %+v %#v %s", cfg, cfg, cfg, cfg)
	require.NotContains(t, buf.String(), secret)
	require.Contains(t, buf.String(), `"signed":true`)
}

func TestServe(t *testing.T) {
	t.Parallel()
	g, err := New(Config{})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var logs logtest.Buffer
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ctx, ln, slog.New(slog.NewTextHandler(&logs, nil))) }()

	base := "http://" + ln.Addr().String()
	b := &bundle{g: g, srv: &httptest.Server{URL: base}, client: &http.Client{}}
	require.Equal(t, http.StatusOK, b.send(t, msg("k", "+1", "acct", 1)).status)
	l, err := FetchLedger(t.Context(), base)
	require.NoError(t, err)
	require.Equal(t, 1, l.Accepted)

	cancel()
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(ShutdownGrace + time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	_, err = FetchLedger(t.Context(), base)
	require.Error(t, err, "the listener must be closed")
	require.Contains(t, logs.String(), "gateway listening")
	require.Contains(t, logs.String(), "gateway stopped")

	// The package-level Serve validates before listening and reports listen errors.
	require.ErrorIs(t, Serve(t.Context(), "127.0.0.1:0", Config{FailRate: 2}, nil), ErrInvalidConfig)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	require.ErrorContains(t, Serve(t.Context(), busy.Addr().String(), Config{}, nil), "listen")
}

func TestServeAddr(t *testing.T) {
	t.Parallel()
	// Find a free port, then let Serve listen on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, addr, Config{}, nil) }()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-errc)
}

func FuzzSend(f *testing.F) {
	good, _ := json.Marshal(msg("k", "+1", "acct", 1))
	f.Add(good, "k", "")
	f.Add(good, "k", sign("fuzz", good))
	f.Add([]byte(`{"id":"k","to":"bad1"}`), "k", "sha256=")
	f.Add([]byte(`{"id":1}`), "", "sha256=zz")
	f.Fuzz(func(t *testing.T, raw []byte, key, sig string) {
		g, err := New(Config{Secret: "fuzz", PermanentPrefix: "bad", FailRate: 0.2, RatePerSec: 1000, Burst: 10, Seed: 1})
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/send", bytes.NewReader(raw))
		req.Header.Set(headerIdempotencyKey, key)
		req.Header.Set(headerSignature, sig)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		l := g.Ledger()
		require.Equal(t, 1, l.Requests)
		checkInvariants(t, l)
		if rec.Code == http.StatusOK {
			// Hex is case-insensitive: an upper-case signature is the same MAC.
			require.True(t, strings.EqualFold(sign("fuzz", raw), sig), "accepted signature %q", sig)
			require.Equal(t, 1, l.AcceptedByKey[key])
		}
		require.True(t, json.Valid(rec.Body.Bytes()), "answers are JSON: %q", rec.Body.String())
	})
}

// BenchmarkSend measures the handler alone, from many goroutines, with keys
// spread over a few accounts.
func BenchmarkSend(b *testing.B) {
	g, err := New(Config{FailRate: 0.01, Seed: 1})
	require.NoError(b, err)
	var n atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			key := "key-" + strconv.FormatUint(i, 10)
			raw, _ := json.Marshal(msg(key, "+1", "acct-"+strconv.FormatUint(i%4, 10), 1))
			req := httptest.NewRequest(http.MethodPost, "/send", bytes.NewReader(raw))
			req.Header.Set(headerIdempotencyKey, key)
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK && rec.Code != http.StatusServiceUnavailable {
				b.Errorf("status %d", rec.Code)
				return
			}
		}
	})
}

// BenchmarkSendHTTP measures full round trips over loopback, the way the
// webhook channel reaches the gateway.
func BenchmarkSendHTTP(b *testing.B) {
	bd := setup(b, Config{})
	var n atomic.Uint64
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := "key-" + strconv.FormatUint(n.Add(1), 10)
			if a, err := bd.trySend(msg(key, "+1", "acct", 1)); err != nil || a.status != http.StatusOK {
				b.Errorf("status %d, err %v", a.status, err)
				return
			}
		}
	})
	b.StopTimer()
	if l := bd.g.Ledger(); l.Accepted != int(n.Load()) {
		b.Fatalf("accepted %d of %d", l.Accepted, n.Load())
	}
}
