package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestRenderBatchesGrowWithTheAccountPool: a task over 100 accounts gets
// render batches of 1,600 recipients (16 an account) instead of the
// configured 500, inline or from the object store, so render still puts
// several jobs of an account in one message; the size is kept in the
// task's record for a resumed expansion, each batch's recipients are
// spread evenly (render's default slack of 0), and a task over 5 accounts
// keeps the configured size.
func TestRenderBatchesGrowWithTheAccountPool(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	const accounts = 100
	var pool []string
	for i := range accounts {
		name := fmt.Sprintf("pool-%03d", i)
		pool = append(pool, name)
		ts.PutAccount(t, name, `{"channel":"sandbox","rate_per_sec":1000,"burst":100,"concurrency":8}`)
	}
	pl := pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	jobsStored := func() uint64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := ts.JS.Stream(ctx, contract.StreamJobs)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return info.State.LastSeq
	}
	recordedSize := func(id string) int {
		e, err := harness.KVGet(t, ts, contract.BucketTasks, id)
		require.NoError(t, err)
		var rec contract.TaskRecord
		require.NoError(t, json.Unmarshal(e.Value(), &rec))
		return rec.BatchSize
	}

	run := func(id string, submit func(), n int) (batches int64, messages uint64) {
		t.Helper()
		b0, j0 := pl.Ingest.Stats.BatchesPublished.Load(), jobsStored()
		submit()
		p := ts.WaitFinal(t, id, 60*time.Second)
		require.Equal(t, [2]int{n, n}, [2]int{p.Total, p.Sent}, "%s: total, sent", id)
		return pl.Ingest.Stats.BatchesPublished.Load() - b0, jobsStored() - j0
	}

	batches, messages := run("inline", func() {
		harness.Submit(t, ts, contract.Task{ID: "inline", Channel: "sandbox", Template: "hi", Accounts: pool, Recipients: pipelinetest.Recipients("in", 4000)})
	}, 4000)
	t.Logf("4,000 recipients over %d named accounts: batch size %d, %d batches, %d job messages", accounts, recordedSize("inline"), batches, messages)
	require.Equal(t, 1600, recordedSize("inline"))
	require.Equal(t, int64(3), batches, "1,600 + 1,600 + 800")
	// 500 a batch gives each account 5 jobs a batch: about 800 messages.
	require.LessOrEqual(t, messages, uint64(4000/8), "jobs grouped in messages")
	// Render balances each batch: no account gets more than its share of
	// a batch (16, 16 and 8 of 1,600, 1,600 and 800), where the rendezvous
	// hash alone gave the busiest of 100 53 of 4,000.
	perAccount := map[string]int{}
	for _, e := range ts.Events(t, "inline") {
		if e.Kind == contract.EventSent {
			perAccount[e.Account]++
		}
	}
	busiest := 0
	for _, c := range perAccount {
		busiest = max(busiest, c)
	}
	t.Logf("busiest account sent %d of 4,000 (mean 40)", busiest)
	require.Len(t, perAccount, accounts)
	require.Equal(t, 16+16+8, busiest, "per-account sends %v", perAccount)

	var list strings.Builder
	for i := range 3200 {
		fmt.Fprintf(&list, `{"to":"obj-%05d"}`+"\n", i)
	}
	harness.PutObject(t, ts, "lists/pool.jsonl", list.String())
	batches, messages = run("listed", func() {
		harness.Submit(t, ts, `{"id":"listed","channel":"sandbox","template":"hi","recipients_object":"lists/pool.jsonl"}`)
	}, 3200)
	t.Logf("3,200 listed recipients over the channel's %d accounts: batch size %d, %d batches, %d job messages", accounts, recordedSize("listed"), batches, messages)
	require.Equal(t, 1600, recordedSize("listed"), "a task naming none counts its channel's accounts")
	require.Equal(t, int64(2), batches)
	require.LessOrEqual(t, messages, uint64(3200/8))

	batches, _ = run("few", func() {
		harness.Submit(t, ts, contract.Task{ID: "few", Channel: "sandbox", Template: "hi", Accounts: pool[:5], Recipients: pipelinetest.Recipients("few", 1200)})
	}, 1200)
	require.Equal(t, 500, recordedSize("few"))
	require.Equal(t, int64(3), batches, "500 + 500 + 200")
}
