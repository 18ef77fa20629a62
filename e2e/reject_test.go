package e2e

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestMalformedTasksRejected submits every kind of bad task and checks each
// is recorded as rejected with an error naming the field, and nothing is
// sent.
func TestMalformedTasksRejected(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, gw.URL))
	ts.PutAccount(t, "sbx", `{"channel":"sandbox"}`)
	pl := pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	ok := `"channel":"webhook","template":"hi","recipients":[{"to":"a"}]`
	cases := []struct {
		id, body, msgID, want string
	}{
		{"r-json", `{"id":"r-json", "channel":`, "r-json", "task: "},
		{"r-notobject", `[1,2,3]`, "r-notobject", "task: must be"},
		{"r-channel", `{"id":"r-channel","template":"hi","recipients":[{"to":"a"}]}`, "", "channel: required"},
		{"r-unknown-ch", `{"id":"r-unknown-ch","channel":"fax","template":"hi","recipients":[{"to":"a"}]}`, "", `channel: unknown channel "fax"`},
		{"r-template", `{"id":"r-template","channel":"webhook","recipients":[{"to":"a"}]}`, "", "template: required"},
		{"r-tmpl-syntax", `{"id":"r-tmpl-syntax","channel":"webhook","template":"hi {{.name","recipients":[{"to":"a"}]}`, "", "template: "},
		{"r-norecip", `{"id":"r-norecip","channel":"webhook","template":"hi"}`, "", "recipients: one of recipients or recipients_object is required"},
		{"r-both", `{"id":"r-both",` + ok + `,"recipients_object":"x.jsonl"}`, "", "recipients_object: give either"},
		{"r-empty-to", `{"id":"r-empty-to","channel":"webhook","template":"hi","recipients":[{"to":"a"},{"to":" "}]}`, "", "recipients[1].to: must not be empty"},
		{"r-type", `{"id":"r-type","channel":"webhook","template":"hi","recipients":[{"to":5}]}`, "", "recipients.to: must be string"},
		{"r-priority", `{"id":"r-priority",` + ok + `,"priority":"urgent"}`, "", "priority: must be high, normal or low"},
		{"r-send-at", `{"id":"r-send-at",` + ok + `,"send_at":"tomorrow"}`, "", "send_at: must be an RFC 3339 time"},
		{"r-expired", `{"id":"r-expired",` + ok + `,"expires_at":"` + past + `"}`, "", "expires_at: " + past + " is already past"},
		{"r-expiry-order", `{"id":"r-expiry-order",` + ok + `,"send_at":"` + future + `","expires_at":"` + future + `"}`, "", "expires_at: must be after send_at"},
		{"r-attempts", `{"id":"r-attempts",` + ok + `,"max_attempts":-1}`, "", "max_attempts: must be between 1 and 100"},
		{"r-unknown-field", `{"id":"r-unknown-field",` + ok + `,"recipents":[]}`, "", "recipents: unknown field"},
		{"r-no-account", `{"id":"r-no-account",` + ok + `,"accounts":["nope"]}`, "", `accounts[0]: no account "nope"`},
		{"r-no-channel-account", `{"id":"r-no-channel-account","channel":"smtp","template":"hi","recipients":[{"to":"a@example.com"}]}`, "", "channel: no smtp account in broadcast_accounts"},
		{"r-wrong-account", `{"id":"r-wrong-account",` + ok + `,"accounts":["sbx"]}`, "", `accounts[0]: account "sbx" is a sandbox account`},
		{"r-dup-account", `{"id":"r-dup-account",` + ok + `,"accounts":["hook","hook"]}`, "", `accounts[1]: account "hook" listed twice`},
		{"r-test-recip", `{"id":"r-test-recip",` + ok + `,"test_recipients":[{"to":""}]}`, "", "test_recipients[0].to: must not be empty"},
		{"r-test-many", `{"id":"r-test-many",` + ok + `,"test_recipients":[` + strings.TrimSuffix(strings.Repeat(`{"to":"q"},`, 101), ",") + `]}`, "", "test_recipients: 101 test recipients, limit is 100"},
		{"r-long-to", `{"id":"r-long-to","channel":"webhook","template":"hi","recipients":[{"to":"` + strings.Repeat("x", 300) + `"}]}`, "", "recipients[0].to: is 300 bytes, limit is 256"},
	}
	for _, c := range cases {
		if c.msgID != "" {
			harness.SubmitWithMsgID(t, ts, []byte(c.body), c.msgID)
		} else {
			harness.Submit(t, ts, c.body)
		}
	}
	// A task whose id is unusable and garbage with no id at all are still
	// recorded, under a generated id.
	harness.Submit(t, ts, `{"id":"has space",`+ok+`}`)
	harness.Submit(t, ts, `not json at all`)
	harness.SubmitWithMsgID(t, ts, nil, "")

	for _, c := range cases {
		p := ts.WaitFinal(t, c.id, 15*time.Second)
		require.Equal(t, contract.StateRejected, p.State, c.id)
		require.Contains(t, p.Error, c.want, c.id)
		require.NotNil(t, p.FinishedAt, c.id)
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		return pl.Ingest.Stats.Rejected.Load() == int64(len(cases)+3)
	})
	require.Zero(t, pl.Ingest.Stats.Accepted.Load())
	require.Zero(t, gw.Ledger().Requests, "nothing was sent")

	// Every rejection, including the three without a usable id, has a
	// rejected event that names the problem.
	var generated []string
	all := ts.AllEvents(t)
	for _, ev := range all {
		require.Equal(t, contract.EventRejected, ev.Kind)
		if !strings.HasPrefix(ev.TaskID, "r-") {
			generated = append(generated, ev.Error)
		}
	}
	require.Len(t, all, len(cases)+3)
	require.Len(t, generated, 3)
	joined := strings.Join(generated, "\n")
	require.Contains(t, joined, "id: must match")
	require.Contains(t, joined, "task: invalid JSON")
	require.Contains(t, joined, "task: empty message")
}

// TestHostileTemplatesRejected submits tasks of two recipients whose
// templates ask print and printf to build hundreds of megabytes (wide
// verbs repeated, a 60 KB string printed again and again, thousands of
// 60 KB variables): each is rejected at intake naming the template field,
// nothing is sent, and the process running every service grows its heap by
// a few megabytes, not the 800-900 MB these tasks once cost ingest and
// render. Not parallel, so the heap is this test's alone.
func TestHostileTemplatesRejected(t *testing.T) {
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q}`, gw.URL))
	pl := pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	big := strings.Repeat("x", 60_000)
	var vars strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&vars, `{{$v%d := print $.big}}`, i)
	}
	cases := []struct{ id, template, want string }{
		{"h-width", `{{printf "` + strings.Repeat("%999999d", 200) + `"` + strings.Repeat(" 1", 200) + `}}`,
			"template: printf: width 999999 exceeds the limit of 4096"},
		{"h-width-arg", `{{printf "` + strings.Repeat("%*d", 100) + `"` + strings.Repeat(" 999999 1", 100) + `}}`,
			"template: printf: width 999999 exceeds the limit of 4096"},
		{"h-print", `{{$s := .big}}{{print` + strings.Repeat(" $s", 200) + `}}`,
			"template: print: result would exceed 65536 bytes"},
		{"h-args", `{{$s := .big}}{{print` + strings.Repeat(" $s", 3000) + `}}`,
			"template: print: 3000 arguments, limit is 256"},
		{"h-vars", vars.String(), "template: print: this message's print, printf, println, html, js and urlquery calls built more than 1048576 bytes"},
	}
	stop := make(chan struct{})
	peak := make(chan uint64)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	go func() {
		var m runtime.MemStats
		top := uint64(0)
		for {
			runtime.ReadMemStats(&m)
			top = max(top, m.HeapAlloc)
			select {
			case <-stop:
				peak <- top
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	for _, c := range cases {
		harness.Submit(t, ts, contract.Task{ID: c.id, Channel: "webhook", Template: c.template, Defaults: map[string]any{"big": big},
			Recipients: []contract.Recipient{{To: "a"}, {To: "b"}}})
	}
	for _, c := range cases {
		p := ts.WaitFinal(t, c.id, 15*time.Second)
		require.Equal(t, contract.StateRejected, p.State, c.id)
		require.Equal(t, c.want, p.Error, c.id)
	}
	close(stop)
	growth := int64(<-peak) - int64(base.HeapAlloc)
	t.Logf("heap peak while %d hostile tasks were rejected: +%.1f MB", len(cases), float64(growth)/1e6)
	require.Less(t, growth, int64(64<<20), "heap growth of the process running every service")
	require.Zero(t, pl.Ingest.Stats.Accepted.Load())
	require.Zero(t, gw.Ledger().Requests, "nothing was sent")
}
