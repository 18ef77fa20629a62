package status

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// fakeBackend serves a fixed snapshot and records control requests.
type fakeBackend struct {
	mu    sync.Mutex
	snap  Snapshot
	wake  chan struct{}
	calls []string
	reply *contract.ControlReply
	err   error
}

func newFakeBackend() *fakeBackend {
	now := time.Now().UTC()
	return &fakeBackend{
		wake: make(chan struct{}),
		snap: Snapshot{At: now, Tasks: []*contract.Progress{
			{TaskID: "running", State: contract.StateProcessing, Total: 100, Sent: 40, Retrying: 2, RatePerSec: 12.5, ETASeconds: 5, CreatedAt: now},
			{TaskID: "done", State: contract.StateSucceeded, Total: 3, Sent: 3, CreatedAt: now.Add(-time.Hour)},
		}, Accounts: []AccountView{{Name: "hook", Channel: "webhook", Enabled: true, State: contract.HealthHealthy, RatePerSec: 10, Ceiling: 20, QueueDepth: 7}}},
		reply: &contract.ControlReply{OK: true, State: contract.StatePaused},
	}
}

func (f *fakeBackend) snapshot() *Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.snap
	s.Tasks = append([]*contract.Progress(nil), f.snap.Tasks...)
	return &s
}

func (f *fakeBackend) snapshotJSON() []byte {
	b, _ := json.Marshal(f.snapshot())
	return b
}

func (f *fakeBackend) task(id string) (*contract.Progress, bool) {
	for _, p := range f.snapshot().Tasks {
		if p.TaskID == id {
			return p, true
		}
	}
	return nil, false
}

func (f *fakeBackend) changes() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wake
}

// setSent changes the running task and wakes the event streams.
func (f *fakeBackend) setSent(n int) {
	f.mu.Lock()
	cp := *f.snap.Tasks[0]
	cp.Sent = n
	f.snap.Tasks[0] = &cp
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeBackend) control(_ context.Context, taskID, action string) (*contract.ControlReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, taskID+" "+action)
	return f.reply, f.err
}

func (f *fakeBackend) controlCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func startHTTP(t *testing.T, b backend, reg *prometheus.Registry) *httptest.Server {
	t.Helper()
	return startGuardedHTTP(t, b, reg, "", 64)
}

// startGuardedHTTP serves the handler as the service does: the guard of
// its listener (loopback names with its port), token and stream cap.
func startGuardedHTTP(t *testing.T, b backend, reg *prometheus.Registry, token string, maxStreams int) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = newHandler(b, reg, slog.New(slog.DiscardHandler), newGuard(srv.Listener.Addr(), token, nil), maxStreams)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(body)
}

func post(t *testing.T, url string, header map[string]string) (*http.Response, contract.ControlReply) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var reply contract.ControlReply
	body, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(body, &reply)
	return res, reply
}

func TestHTTPServesAPageWithoutExternalResources(t *testing.T) {
	t.Parallel()
	srv := startHTTP(t, newFakeBackend(), nil)
	for _, path := range []string{"/", "/app.js", "/style.css"} {
		res, body := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.NotContains(t, body, "http://", "%s loads nothing from elsewhere", path)
		require.NotContains(t, body, "https://", "%s loads nothing from elsewhere", path)
		require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
		require.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	}
	res, body := get(t, srv.URL+"/")
	require.Contains(t, res.Header.Get("Content-Type"), "text/html")
	require.Contains(t, body, `<script src="app.js" defer></script>`)
	_, js := get(t, srv.URL+"/app.js")
	require.NotContains(t, js, "innerHTML", "server data goes in as text only")
	require.Contains(t, js, "new EventSource('api/events')")
}

func TestHTTPListsTasksAndAccounts(t *testing.T) {
	t.Parallel()
	srv := startHTTP(t, newFakeBackend(), nil)

	res, body := get(t, srv.URL+"/api/tasks")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
	var tasks struct {
		Tasks []contract.Progress `json:"tasks"`
		More  int                 `json:"more"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &tasks))
	require.Len(t, tasks.Tasks, 2)
	require.Equal(t, "running", tasks.Tasks[0].TaskID)
	require.Equal(t, 40, tasks.Tasks[0].Sent)

	_, body = get(t, srv.URL+"/api/accounts")
	var accounts struct {
		Accounts []AccountView `json:"accounts"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &accounts))
	require.Equal(t, []AccountView{{Name: "hook", Channel: "webhook", Enabled: true, State: "healthy", RatePerSec: 10, Ceiling: 20, QueueDepth: 7}}, accounts.Accounts)

	res, body = get(t, srv.URL+"/api/tasks/done")
	require.Equal(t, http.StatusOK, res.StatusCode)
	var p contract.Progress
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, contract.StateSucceeded, p.State)

	res, _ = get(t, srv.URL+"/api/tasks/nope")
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

func TestHTTPControlForwardsButtonPresses(t *testing.T) {
	t.Parallel()
	b := newFakeBackend()
	srv := startHTTP(t, b, nil)
	base := srv.URL + "/api/tasks/"

	res, reply := post(t, base+"running/pause", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, contract.ControlReply{OK: true, State: contract.StatePaused}, reply)
	require.Equal(t, []string{"running pause"}, b.controlCalls())

	for _, action := range []string{"resume", "cancel", "retry-dead"} {
		res, _ = post(t, base+"running/"+action, map[string]string{"Sec-Fetch-Site": "same-origin"})
		require.Equal(t, http.StatusOK, res.StatusCode, action)
	}
	require.Len(t, b.controlCalls(), 4)

	// Refused by ingest: the reply is passed on with 409.
	b.mu.Lock()
	b.reply, b.err = &contract.ControlReply{OK: false, Error: "task running is already succeeded"}, errors.New("refused")
	b.mu.Unlock()
	res, reply = post(t, base+"running/pause", nil)
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Equal(t, "task running is already succeeded", reply.Error)

	// Nobody answers on broadcast.control.<task>.
	b.mu.Lock()
	b.reply, b.err = nil, nats.ErrNoResponders
	b.mu.Unlock()
	res, reply = post(t, base+"running/pause", nil)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Contains(t, reply.Error, "no ingest service")

	b.mu.Lock()
	b.reply, b.err = nil, context.DeadlineExceeded
	b.mu.Unlock()
	res, _ = post(t, base+"running/pause", nil)
	require.Equal(t, http.StatusBadGateway, res.StatusCode)

	calls := len(b.controlCalls())
	// Bad ids and actions never reach NATS.
	res, _ = post(t, base+"bad.id/pause", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	res, _ = post(t, base+strings.Repeat("x", 65)+"/pause", nil)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	res, _ = post(t, base+"running/explode", nil)
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	res, _ = get(t, base+"running/pause")
	require.Equal(t, http.StatusNotFound, res.StatusCode, "only POST controls")
	// Another site open in the operator's browser cannot press the buttons.
	res, _ = post(t, base+"running/cancel", map[string]string{"Sec-Fetch-Site": "cross-site"})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	res, _ = post(t, base+"running/cancel", map[string]string{"Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Len(t, b.controlCalls(), calls)
}

// readEvent reads one server-sent event and returns its data.
func readEvent(t *testing.T, r *bufio.Reader) Snapshot {
	t.Helper()
	var event, data string
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			require.Equal(t, "snapshot", event)
			var s Snapshot
			require.NoError(t, json.Unmarshal([]byte(data), &s))
			return s
		}
	}
}

func TestHTTPEventsStreamSnapshots(t *testing.T) {
	t.Parallel()
	b := newFakeBackend()
	srv := startHTTP(t, b, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/events", nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	r := bufio.NewReader(res.Body)

	first := readEvent(t, r)
	require.Equal(t, 40, first.Tasks[0].Sent, "the current state comes at once")

	// A change is pushed promptly, not at the next heartbeat.
	time.Sleep(minPush)
	start := time.Now()
	b.setSent(55)
	got := readEvent(t, r)
	require.Equal(t, 55, got.Tasks[0].Sent)
	require.Less(t, time.Since(start), maxQuiet/2)

	// Without changes a snapshot still comes about once a second.
	start = time.Now()
	readEvent(t, r)
	require.InDelta(t, maxQuiet.Seconds(), time.Since(start).Seconds(), 0.4)
}

func TestHTTPMetricsOnlyWithARegistry(t *testing.T) {
	t.Parallel()
	res, _ := get(t, startHTTP(t, newFakeBackend(), nil).URL+"/metrics")
	require.Equal(t, http.StatusNotFound, res.StatusCode)

	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "broadcast_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	res, body := get(t, startHTTP(t, newFakeBackend(), reg).URL+"/metrics")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "broadcast_test_total 3")
}
