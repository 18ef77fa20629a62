package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestRecipientsFromObjectStore streams JSONL and CSV lists, with repeated
// addresses, unusable lines and per-recipient variables.
func TestRecipientsFromObjectStore(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":1000,"burst":50,"concurrency":16}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	var b strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&b, `{"to":"j%04d","vars":{"name":"N%d"}}`+"\n", i, i)
	}
	b.WriteString(`{"to":"j0001","vars":{"name":"again"}}` + "\n") // duplicate
	b.WriteString("{not json\n")                                   // unusable line
	b.WriteString(`{"to":"j-novar"}` + "\n")                       // lacks name
	harness.PutObject(t, ts, "lists/big.jsonl", b.String())
	harness.Submit(t, ts, `{"id":"obj-jsonl","channel":"webhook","template":"Hi {{.name}}","recipients_object":"lists/big.jsonl"}`)
	p := ts.WaitFinal(t, "obj-jsonl", 60*time.Second)
	require.Equal(t, 3002, p.Total)
	require.Equal(t, 1, p.Duplicates)
	require.Equal(t, 3000, p.Sent)
	require.Equal(t, 2, p.Skipped, "the unusable line and the recipient lacking a variable")
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, "Hi N1", gw.Ledger().Bodies["obj-jsonl.1"], "the first occurrence wins")

	harness.PutObject(t, ts, "lists/small.csv", "to,name,code\nc1,Li,A\nc2,Wang,B\nc1,Li,A\n")
	harness.Submit(t, ts, `{"id":"obj-csv","channel":"webhook","template":"{{.name}}:{{.code}}","recipients_object":"lists/small.csv"}`)
	p = ts.WaitFinal(t, "obj-csv", 20*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 2, p.Total)
	require.Equal(t, 1, p.Duplicates)
	require.Equal(t, "Wang:B", gw.Ledger().Bodies["obj-csv.1"])

	harness.Submit(t, ts, `{"id":"obj-missing","channel":"webhook","template":"x","recipients_object":"lists/nope.jsonl"}`)
	p = ts.WaitFinal(t, "obj-missing", 10*time.Second)
	require.Equal(t, contract.StateRejected, p.State)
	require.Contains(t, p.Error, `recipients_object: no object "lists/nope.jsonl"`)

	harness.PutObject(t, ts, "lists/bad.csv", "phone,name\n1,a\n")
	harness.Submit(t, ts, `{"id":"obj-bad","channel":"webhook","template":"x","recipients_object":"lists/bad.csv"}`)
	p = ts.WaitFinal(t, "obj-bad", 10*time.Second)
	require.Contains(t, p.Error, `recipients_object: lists/bad.csv: header: no "to" column`)
}

// TestStreamedExpansionResumesFromCheckpoint plants the records a crashed
// ingest left (claimed, 2,000 of 5,000 recipients published) and checks the
// redelivered submissions publish only the rest, in batches of the size
// the record kept (the configured size for a record that kept none).
func TestStreamedExpansionResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "sbx", `{"channel":"sandbox","rate_per_sec":5000,"burst":100,"concurrency":32}`)
	var b strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&b, `{"to":"r%05d"}`+"\n", i)
	}
	harness.PutObject(t, ts, "lists/resume.jsonl", b.String())

	ctx := context.Background()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketTasks)
	require.NoError(t, err)
	sizes := map[string]int{"resume": 0, "resume-sized": 250}
	for id, size := range sizes {
		task := fmt.Sprintf(`{"id":%q,"channel":"sandbox","template":"x","recipients_object":"lists/resume.jsonl"}`, id)
		m := nats.NewMsg(contract.SubjectTasks)
		m.Data = []byte(task)
		ack, err := ts.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		parsed, err := contract.DecodeTask([]byte(task))
		require.NoError(t, err)
		parsed.Normalize()
		rec := contract.TaskRecord{Task: *parsed, Seq: ack.Sequence, Total: 5000, Checkpoint: 2000, BatchSize: size, AcceptedAt: time.Now()}
		data, _ := json.Marshal(rec)
		_, err = kv.Create(ctx, id, data)
		require.NoError(t, err)
	}

	cfg := harness.FastRetries()
	cfg.Ingest.BatchSize = 100
	pl := pipelinetest.StartPipeline(t, ts, cfg)
	natstest.Eventually(t, 20*time.Second, func() bool { return pl.Ingest.Stats.Accepted.Load() == 2 })
	require.Equal(t, int64(30+12), pl.Ingest.Stats.BatchesPublished.Load(), "only the 3,000 recipients after the checkpoint, in 30 batches of 100 and 12 of 250")
	for id := range sizes {
		// The 2,000 planted as published never were (this test made them
		// up), so the task stays open with exactly the other 3,000 sent.
		ts.WaitProgress(t, id, 60*time.Second, func(p *contract.Progress) bool { return p.Sent == 3000 })
		lowest := 5000
		for _, ev := range ts.Events(t, id) {
			if ev.Kind == contract.EventSent {
				lowest = min(lowest, ev.Index)
			}
		}
		require.Equal(t, 2000, lowest, "%s: nothing before the checkpoint was enqueued again", id)
		p := ts.Progress(t, id)
		require.Equal(t, 5000, p.Total)
		require.Equal(t, contract.StateProcessing, p.State)
	}
}

// TestScheduledListReplacedIsNotSent: a scheduled task's list is pinned by
// its digest at intake. Replaced before the start, it is not sent (its
// recipients are not the ones counted): the task ends cancelled with the
// reason, every count adds up to the total accepted, nothing reaches the
// gateway.
func TestScheduledListReplacedIsNotSent(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":10,"concurrency":8`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	line := func(prefix string, n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "{\"to\":\"%s%03d\"}\n", prefix, i)
		}
		return b.String()
	}
	harness.PutObject(t, ts, "lists/pinned.jsonl", line("a", 10))
	sendAt := time.Now().Add(3 * time.Second).Truncate(time.Second)
	task := contract.Task{ID: "pinned", Channel: "webhook", Template: "hi", RecipientsObject: "lists/pinned.jsonl", SendAt: sendAt.UTC().Format(time.RFC3339)}
	harness.Submit(t, ts, task)
	ts.WaitProgress(t, task.ID, 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateScheduled })
	harness.PutObject(t, ts, "lists/pinned.jsonl", line("b", 25)) // replaced before the start

	p := ts.WaitFinal(t, task.ID, 15*time.Second)
	t.Logf("list replaced before its scheduled start: state %s total %d cancelled %d sent %d; gateway got %d; error %q",
		p.State, p.Total, p.Cancelled, p.Sent, gw.Ledger().Requests, p.Error)
	require.Equal(t, contract.StateCancelled, p.State)
	require.Equal(t, 10, p.Total)
	require.Equal(t, 10, p.Cancelled)
	require.Zero(t, p.Sent)
	require.Zero(t, gw.Ledger().Requests, "nothing of either list was sent")
	require.Contains(t, p.Error, "was replaced after the task was accepted")
}
