package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/render"
)

// TestTaskWaitsForDisabledAccount: a task naming only a disabled account
// is accepted, not rejected (seed 593585011 published one while the
// account was briefly off); its progress says why it waits, and once the
// account is enabled every recipient is sent exactly once.
func TestTaskWaitsForDisabledAccount(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	off := `"rate_per_sec":200,"burst":20,"concurrency":4,"enabled":false`
	ts.PutAccount(t, "dis-a", harness.WebhookAccount(rec.URL, off))
	ts.PutAccount(t, "dis-b", harness.WebhookAccount(rec.URL, `"rate_per_sec":200`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Render: render.Config{NoAccountRetry: 300 * time.Millisecond}})

	task := contract.Task{ID: "dis-wait", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"dis-a"}, Recipients: pipelinetest.Recipients("d", 50)}
	harness.Submit(t, ts, task)
	p := ts.WaitProgress(t, task.ID, 15*time.Second, func(p *contract.Progress) bool {
		return p.State == contract.StateProcessing && p.Error != ""
	}, "processing, with the reason it waits")
	require.Equal(t, "waiting: no enabled account among dis-a", p.Error)
	require.Equal(t, 50, p.Total)
	require.Zero(t, p.Done())
	require.Zero(t, gw.Ledger().Requests, "nothing sent through the account not named")

	ts.PutAccount(t, "dis-a", harness.WebhookAccount(rec.URL, strings.Replace(off, "false", "true", 1)))
	p = ts.WaitFinal(t, task.ID, 20*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 50, p.Sent)
	require.Empty(t, p.Error, "nothing waits any more")
	require.Equal(t, 50, gw.Ledger().AcceptedKeys())
	require.Zero(t, gw.Ledger().Duplicates)
}
