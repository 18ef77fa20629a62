package e2e

import (
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

// TestLargeVariablesFitMaxPayload: a list of 300 recipients with 40 KiB of
// variables each (12 MB, past the server's 8 MB max_payload in one render
// batch of 500, which was retried forever) is sent in smaller batches; an
// inline recipient whose variables could not fit any job is skipped with
// the reason, and the task still ends.
func TestLargeVariablesFitMaxPayload(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "big", harness.WebhookAccount(gw.URL, `"rate_per_sec":500,"burst":50,"concurrency":16`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})

	blob := strings.Repeat("v", 40<<10)
	var b strings.Builder
	for i := range 300 {
		line, _ := json.Marshal(contract.Recipient{To: fmt.Sprintf("L%03d", i), Vars: map[string]any{"blob": blob}})
		b.Write(line)
		b.WriteByte('\n')
	}
	harness.PutObject(t, ts, "lists/big.jsonl", b.String())
	listTask := contract.Task{ID: "bigvars", Channel: "webhook", Template: "hi {{.to}} {{len .blob}}", RecipientsObject: "lists/big.jsonl"}
	harness.Submit(t, ts, listTask)

	inline := contract.Task{ID: "hugevar", Channel: "webhook", Template: "hi {{.to}}", Recipients: []contract.Recipient{
		{To: "small"}, {To: "huge", Vars: map[string]any{"blob": strings.Repeat("h", 300<<10)}},
	}}
	harness.Submit(t, ts, inline)

	p := ts.WaitFinal(t, listTask.ID, 60*time.Second)
	q := ts.WaitFinal(t, inline.ID, 30*time.Second)
	var reason string
	for _, e := range harness.EventsOf(ts.Events(t, inline.ID), contract.EventSkipped) {
		reason = e.Error
	}
	t.Logf("300 recipients x 40 KiB vars from the object store: %s, sent %d; inline 300 KiB vars: %s sent %d skipped %d (%q)",
		p.State, p.Sent, q.State, q.Sent, q.Skipped, reason)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 300, p.Sent)
	require.Equal(t, contract.StatePartial, q.State)
	require.Equal(t, 1, q.Sent)
	require.Equal(t, 1, q.Skipped)
	require.Contains(t, reason, "vars: more than")
}
