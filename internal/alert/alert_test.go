package alert

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// receiver is an operator webhook that records the texts it got.
type receiver struct {
	*httptest.Server
	mu    sync.Mutex
	texts []string
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body map[string]string
		raw, _ := io.ReadAll(req.Body)
		if req.Header.Get("Content-Type") != "application/json" || json.Unmarshal(raw, &body) != nil || len(body) != 1 {
			http.Error(w, "want {\"text\":...}", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.texts = append(r.texts, body["text"])
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.texts...)
}

func TestOnePerSubjectPerInterval(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, http.StatusOK)
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	counts := map[string]int{}
	n, err := New(Config{URL: rcv.URL, Interval: time.Minute, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Count: func(r string) { mu.Lock(); counts[r]++; mu.Unlock() }})
	require.NoError(t, err)
	require.True(t, n.Alert("task.a.final", "task a ended partial"))
	require.False(t, n.Alert("task.a.final", "task a ended partial again"), "same subject within the interval")
	require.True(t, n.Alert("account.x.paused", "account x paused"), "another subject")
	mu.Lock()
	now = now.Add(59 * time.Second)
	mu.Unlock()
	require.False(t, n.Alert("task.a.final", "still within"))
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	require.True(t, n.Alert("task.a.final", "a minute later"))
	n.Wait()
	require.ElementsMatch(t, []string{"task a ended partial", "account x paused", "a minute later"}, rcv.got())
	mu.Lock()
	require.Equal(t, map[string]int{Sent: 3, Suppressed: 2}, counts)
	mu.Unlock()
}

func TestFailuresAreCountedNotFatal(t *testing.T) {
	t.Parallel()
	rcv := newReceiver(t, http.StatusInternalServerError)
	var failed int
	var mu sync.Mutex
	n, err := New(Config{URL: rcv.URL, Count: func(r string) { mu.Lock(); defer mu.Unlock(); failed += map[string]int{Failed: 1}[r] }})
	require.NoError(t, err)
	require.True(t, n.Alert("s", "text"))
	n.Wait()
	require.Len(t, rcv.got(), 2, "tried twice")
	mu.Lock()
	require.Equal(t, 1, failed)
	mu.Unlock()
}

func TestConfig(t *testing.T) {
	t.Parallel()
	n, err := New(Config{})
	require.NoError(t, err)
	require.Nil(t, n, "no URL, no notifier")
	require.False(t, n.Alert("s", "t"), "a nil notifier sends nothing")
	n.Wait()
	for _, u := range []string{"ftp://x", "not a url", "http://"} {
		_, err := New(Config{URL: u})
		require.ErrorContains(t, err, "ALERT_URL", u)
	}
	_, err = New(Config{URL: "http://x", Interval: -time.Second})
	require.ErrorContains(t, err, "ALERT_INTERVAL")
}
