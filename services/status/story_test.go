package status

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
)

// fakeOperator adds the operator's reads to fakeBackend and records what
// they were asked.
type fakeOperator struct {
	*fakeBackend
	mu      sync.Mutex
	asked   []string
	retried []uint64
	series  *seriesStore
}

func (f *fakeOperator) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, s)
}

func (f *fakeOperator) seriesView(name string, account bool, seconds int) (*SeriesView, bool) {
	return f.series.view(name, account, seconds)
}

func (f *fakeOperator) deadLetters(_ context.Context, taskID string, offset, limit int) (*client.DeadPage, error) {
	f.note("dead " + taskID + " " + itoa(offset) + " " + itoa(limit))
	return &client.DeadPage{Task: taskID, Total: 1, Letters: []client.DeadEntry{{Seq: 7, To: "bad-1"}}}, nil
}

func (f *fakeOperator) failures(_ context.Context, taskID string) (*client.Failures, error) {
	f.note("failures " + taskID)
	return &client.Failures{Task: taskID, Groups: []client.FailureGroup{{Kind: contract.EventFailed, Code: "400", Count: 3}}}, nil
}

func (f *fakeOperator) events(_ context.Context, taskID string, kind contract.EventKind, after uint64, limit int) (*client.EventsPage, error) {
	f.note("events " + taskID + " " + string(kind) + " " + itoa(int(after)) + " " + itoa(limit))
	return &client.EventsPage{Task: taskID, Events: []client.EventEntry{}}, nil
}

func (f *fakeOperator) lookup(_ context.Context, to string) (*client.Lookup, error) {
	f.note("lookup " + to)
	return &client.Lookup{To: to, Entries: []contract.LookupEntry{}}, nil
}

func (f *fakeOperator) retrySelected(_ context.Context, taskID string, seqs []uint64) (*contract.ControlReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retried = append(f.retried, seqs...)
	return &contract.ControlReply{OK: true, Requeued: len(seqs)}, nil
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func (f *fakeOperator) askedFor() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

func newFakeOperator() *fakeOperator {
	f := &fakeOperator{fakeBackend: newFakeBackend(), series: newSeriesStore(4)}
	f.series.record(&contract.Event{TaskID: "running", Account: "hook", Kind: contract.EventSent, At: time.Now()})
	return f
}

// TestStoryPagesLoadNothingFromElsewhere: the operator's pages come with
// the strict CSP and name only their own scripts and stylesheet.
func TestStoryPagesLoadNothingFromElsewhere(t *testing.T) {
	t.Parallel()
	srv := startHTTP(t, newFakeOperator(), nil)
	external := regexp.MustCompile(`(src|href)="(https?:)?//|url\(|@import|fetch\(['"]https?:`)
	for _, path := range []string{"/tasks/running", "/task.js", "/chart.js", "/account.html", "/account.js", "/lookup.html", "/lookup.js", "/style.css"} {
		res, body := get(t, srv.URL+path)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.False(t, external.MatchString(body), "%s loads nothing from elsewhere: %s", path, external.FindString(body))
		require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'", path)
		require.NotContains(t, body, "innerHTML", "%s puts server data in as text only", path)
		require.NotContains(t, body, "<script>", "%s has no inline script", path)
	}
	res, body := get(t, srv.URL+"/tasks/running")
	require.Contains(t, res.Header.Get("Content-Type"), "text/html")
	require.Contains(t, body, `<script src="../task.js" defer></script>`)
}

func TestStoryAPIChecksItsParameters(t *testing.T) {
	t.Parallel()
	f := newFakeOperator()
	srv := startHTTP(t, f, nil)
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/api/series?task=running", 200, `"task":"running"`},
		{"/api/series?account=hook&seconds=5", 200, `"account":"hook"`},
		{"/api/series?task=nobody", 404, "no series for nobody"},
		{"/api/series", 400, "task, account: give exactly one"},
		{"/api/series?task=a&account=b", 400, "give exactly one"},
		{"/api/series?task=a.b", 400, "must match"},
		{"/api/series?task=running&seconds=3601", 400, "seconds: must be a whole number from 1 to 3600"},
		{"/api/tasks/running/dead", 200, `"letters":[{"seq":7`},
		{"/api/tasks/running/dead?offset=10&limit=5", 200, `"total":1`},
		{"/api/tasks/running/dead?limit=0", 400, "limit: must be a whole number from 1 to 500"},
		{"/api/tasks/running/dead?offset=-1", 400, "offset: must be"},
		{"/api/tasks/running/failures", 200, `"count":3`},
		{"/api/tasks/running/events?kind=failed&after=12&limit=3", 200, `"events":[]`},
		{"/api/tasks/running/events?kind=nonsense", 400, `kind: \"nonsense\" is not an event kind`},
		{"/api/tasks/running/events?after=x", 400, `after: \"x\" is not a stream sequence`},
		{"/api/lookup?to=%2B8613800000001", 200, `"to":"+8613800000001"`},
		{"/api/lookup", 400, "to: give the recipient"},
		{"/api/lookup?to=%20%20", 400, "to: must not be empty"},
		{"/api/lookup?to=" + strings.Repeat("x", 300), 400, "to: is 300 bytes"},
	} {
		res, body := get(t, srv.URL+c.path)
		require.Equal(t, c.code, res.StatusCode, "%s: %s", c.path, body)
		require.Contains(t, body, c.want, c.path)
	}
	require.Equal(t, []string{"dead running 0 50", "dead running 10 5", "failures running", "events running failed 12 3",
		"lookup +8613800000001"}, f.askedFor(), "defaults and parameters as passed on")
}

func TestStoryRetryOfASelection(t *testing.T) {
	t.Parallel()
	f := newFakeOperator()
	srv := startHTTP(t, f, nil)
	postBody := func(body string) (int, contract.ControlReply) {
		res, err := http.Post(srv.URL+"/api/tasks/running/retry-dead", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer res.Body.Close()
		var r contract.ControlReply
		require.NoError(t, json.NewDecoder(res.Body).Decode(&r))
		return res.StatusCode, r
	}
	code, r := postBody(`{"seqs":[12,15,12]}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3, r.Requeued)
	require.Equal(t, []uint64{12, 15, 12}, f.retried, "the selection goes on as given (dispatch drops repeats)")
	require.Empty(t, f.controlCalls())

	code, _ = postBody(`{}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []string{"running retry-dead"}, f.controlCalls(), "no selection: retry-dead of every dead letter")

	code, _ = postBody(`{"seqs":"all"}`)
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = postBody(`{"seqs":[` + strings.Repeat("1,", contract.MaxRetrySelection) + `1]}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Len(t, f.retried, 3, "nothing more was retried")
}
