package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// operatorSetup runs the pipeline with its dashboard against a gateway
// that rejects recipients starting with "bad-" permanently.
type operatorSetup struct {
	ts  *pipelinetest.Server
	gw  *harness.RecordedGateway
	p   *pipelinetest.Pipeline
	url string
}

func startOperatorSetup(t *testing.T, rate int) *operatorSetup {
	t.Helper()
	return startOperatorSetupOn(t, pipelinetest.Start(t), nil, rate)
}

// startOperatorSetupOn is startOperatorSetup on a given server, with the
// services connecting as users (nil: the server's own client).
func startOperatorSetupOn(t *testing.T, ts *pipelinetest.Server, users map[string]natstest.Credentials, rate int) *operatorSetup {
	t.Helper()
	gw := harness.StartGateway(t, gateway.Config{Seed: 1, PermanentPrefix: "bad-"})
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":%d,"burst":1,"concurrency":2}`, gw.URL, rate))
	cfg := harness.FastRetries()
	cfg.Users = users
	cfg.Status.DashboardAddr = "127.0.0.1:0"
	cfg.Status.PollInterval = 500 * time.Millisecond
	p := pipelinetest.StartPipeline(t, ts, cfg)
	natstest.Eventually(t, 10*time.Second, func() bool { return p.Status.DashboardURL() != "" })
	return &operatorSetup{ts: ts, gw: gw, p: p, url: p.Status.DashboardURL()}
}

func (o *operatorSetup) get(t *testing.T, path string, v any) int {
	t.Helper()
	res, err := http.Get(o.url + path)
	require.NoError(t, err)
	defer res.Body.Close()
	require.NoError(t, json.NewDecoder(res.Body).Decode(v), path)
	return res.StatusCode
}

// requestsFor returns how many send requests the gateway got for each of
// the task's dead letters' jobs.
func requestsByKey(gw *harness.RecordedGateway, keys []string) map[string]int {
	l := gw.Ledger()
	out := map[string]int{}
	for _, k := range keys {
		out[k] = l.RequestsByKey[k]
	}
	return out
}

// TestOperatorAPI: a task with permanent failures ends partial; its
// failures are grouped, its dead letters page with every attempt, its
// series count what was sent and failed, a recipient's lookup shows each
// outcome, and a retry of two selected dead letters re-sends exactly those
// two (the gateway's own ledger says so).
func TestOperatorAPI(t *testing.T) {
	t.Parallel()
	checkOperatorStory(t, startOperatorSetup(t, 200))
}

// TestOperatorAPILeastPrivilege runs the same story with every service
// connected as its own user of auth.conf: no permission is missing (the
// server logs none), and the operator user reads what the CLI shows.
func TestOperatorAPILeastPrivilege(t *testing.T) {
	t.Parallel()
	cs, users, _ := startSecureServer(t, natstest.ConfigOptions{})
	o := startOperatorSetupOn(t, cs.Server, users, 200)
	checkOperatorStory(t, o)
	ctx := t.Context()
	page, err := client.DeadLetters(ctx, cs.JS, "story", 0, 10)
	require.NoError(t, err, "the operator reads dead letters")
	require.Equal(t, 6, page.Total)
	one, err := client.DeadLetter(ctx, cs.JS, "story", page.Letters[0].Seq)
	require.NoError(t, err)
	require.Equal(t, page.Letters[0].To, one.To)
	found, err := client.LookupRecipient(ctx, cs.JS, "user-0000")
	require.NoError(t, err, "the operator reads the recipient index")
	require.Len(t, found.Entries, 1)
	require.Empty(t, uniqueViolations(cs.Log.Violations()), "permission violations")
}

func checkOperatorStory(t *testing.T, o *operatorSetup) {
	t.Helper()
	rs, bad := pipelinetest.RecipientsWithRejects(30, 5, 2) // bad-0002, bad-0007, ...
	require.Equal(t, 6, bad)
	harness.Submit(t, o.ts, contract.Task{ID: "story", Channel: "webhook", Template: "hi {{.to}}", Recipients: rs})
	harness.Submit(t, o.ts, contract.Task{ID: "other", Channel: "webhook", Template: "hi", Recipients: []contract.Recipient{{To: "bad-x"}}})
	final := o.ts.WaitFinal(t, "story", 30*time.Second)
	require.Equal(t, contract.StatePartial, final.State)
	require.Equal(t, 24, final.Sent)
	require.Equal(t, 6, final.Failed)

	var fails client.Failures
	require.Equal(t, http.StatusOK, o.get(t, "api/tasks/story/failures", &fails))
	require.Len(t, fails.Groups, 1, "one kind of failure: %+v", fails.Groups)
	g := fails.Groups[0]
	require.Equal(t, contract.EventFailed, g.Kind)
	require.Equal(t, "hook", g.Account)
	require.Equal(t, 6, g.Count)
	require.NotEmpty(t, g.Code)
	require.True(t, strings.HasPrefix(g.Example.To, "bad-"), g.Example.To)
	require.Contains(t, g.Example.Error, "400")

	var page1, page2 client.DeadPage
	require.Equal(t, http.StatusOK, o.get(t, "api/tasks/story/dead?offset=0&limit=4", &page1))
	require.Equal(t, http.StatusOK, o.get(t, "api/tasks/story/dead?offset=4&limit=4", &page2))
	require.Equal(t, 6, page1.Total)
	require.Len(t, page1.Letters, 4)
	require.Len(t, page2.Letters, 2, "the last page holds the rest")
	letters := append(page1.Letters, page2.Letters...)
	seen := map[string]bool{}
	for _, l := range letters {
		require.True(t, strings.HasPrefix(l.To, "bad-"), l.To)
		require.Equal(t, "hook", l.Account)
		require.NotEmpty(t, l.Attempts, "every attempt's code and error")
		require.Equal(t, g.Code, l.Attempts[len(l.Attempts)-1].Code)
		require.NotZero(t, l.At)
		require.False(t, seen[l.To], "no letter twice across pages")
		seen[l.To] = true
	}
	var badReq map[string]string
	require.Equal(t, http.StatusBadRequest, o.get(t, "api/tasks/story/dead?limit=5000", &badReq))
	require.Contains(t, badReq["error"], "limit:")

	var failedEvents client.EventsPage
	require.Equal(t, http.StatusOK, o.get(t, "api/tasks/story/events?kind=failed&limit=100", &failedEvents))
	require.Len(t, failedEvents.Events, 6)
	for _, e := range failedEvents.Events {
		require.Equal(t, contract.EventFailed, e.Kind)
	}
	var firstTwo client.EventsPage
	require.Equal(t, http.StatusOK, o.get(t, "api/tasks/story/events?kind=sent&limit=2", &firstTwo))
	require.Len(t, firstTwo.Events, 2)
	require.Equal(t, firstTwo.Events[1].Seq, firstTwo.Next)
	var rest client.EventsPage
	require.Equal(t, http.StatusOK, o.get(t, fmt.Sprintf("api/tasks/story/events?kind=sent&limit=500&after=%d", firstTwo.Next), &rest))
	require.Len(t, rest.Events, 22, "24 sent events, two on the first page")

	var series status.SeriesView
	require.Equal(t, http.StatusOK, o.get(t, "api/series?task=story&seconds=3600", &series))
	require.Equal(t, uint32(24), sum(series.PerSecond.Sent))
	require.Equal(t, uint32(6), sum(series.PerSecond.Failed))
	require.Equal(t, uint32(24), sum(series.PerMinute.Sent))
	var acct status.SeriesView
	require.Equal(t, http.StatusOK, o.get(t, "api/series?account=hook", &acct))
	require.Equal(t, uint32(24), sum(acct.PerSecond.Sent))
	var none map[string]string
	require.Equal(t, http.StatusBadRequest, o.get(t, "api/series?task=a&account=b", &none))

	var sent client.Lookup
	natstest.Eventually(t, 10*time.Second, func() bool {
		o.get(t, "api/lookup?to="+rs[0].To, &sent)
		return len(sent.Entries) == 1
	})
	require.Equal(t, "story", sent.Entries[0].TaskID)
	require.Equal(t, contract.EventSent, sent.Entries[0].Kind)
	require.Equal(t, "hook", sent.Entries[0].Account)
	var failed client.Lookup
	o.get(t, "api/lookup?to=%2Bbad-0002", &failed) // another recipient
	require.Empty(t, failed.Entries)
	o.get(t, "api/lookup?to=%20bad-0002%20", &failed)
	require.Len(t, failed.Entries, 1, "the recipient is trimmed like the channel does")
	require.Equal(t, contract.EventFailed, failed.Entries[0].Kind)

	// Retry two of the six: exactly those two are sent again.
	keys := make([]string, len(letters))
	for i, l := range letters {
		keys[i] = l.JobID
	}
	before := requestsByKey(o.gw, keys)
	body, _ := json.Marshal(map[string]any{"seqs": []uint64{letters[1].Seq, letters[4].Seq}})
	res, err := http.Post(o.url+"api/tasks/story/retry-dead", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	var reply contract.ControlReply
	require.NoError(t, json.NewDecoder(res.Body).Decode(&reply))
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, reply.Error)
	require.Equal(t, 2, reply.Requeued)
	natstest.Eventually(t, 15*time.Second, func() bool {
		after := requestsByKey(o.gw, keys)
		return after[keys[1]] > before[keys[1]] && after[keys[4]] > before[keys[4]]
	})
	o.ts.WaitProgress(t, "story", 15*time.Second, func(p *contract.Progress) bool { return p.State.Final() && p.Failed == 6 })
	time.Sleep(500 * time.Millisecond) // anything else would have been sent by now
	after := requestsByKey(o.gw, keys)
	for i, k := range keys {
		want := before[k]
		if i == 1 || i == 4 {
			want++
		}
		require.Equal(t, want, after[k], "requests for %s (%s)", letters[i].To, k)
	}
	var again client.DeadPage
	o.get(t, "api/tasks/story/dead", &again)
	require.Equal(t, 6, again.Total, "the two failed again and are dead letters again, the four untouched")
	var wrong contract.ControlReply
	o.ts.WaitFinal(t, "other", 10*time.Second)
	var others client.DeadPage
	o.get(t, "api/tasks/other/dead", &others)
	require.Len(t, others.Letters, 1)
	body, _ = json.Marshal(map[string]any{"seqs": []uint64{others.Letters[0].Seq}}) // another task's dead letter
	res, err = http.Post(o.url+"api/tasks/story/retry-dead", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(res.Body).Decode(&wrong))
	res.Body.Close()
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Contains(t, wrong.Error, "seqs:")
	require.Contains(t, wrong.Error, "is not a dead letter of task story")
}

func sum(v []uint32) uint32 {
	var s uint32
	for _, n := range v {
		s += n
	}
	return s
}
