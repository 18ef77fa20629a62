package dispatch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// capReachedAt is the time of the first daily_cap retrying event of a task.
func capReachedAt(t *testing.T, ts *pipelinetest.Server, taskID string) time.Time {
	var first time.Time
	for _, e := range capWaits(t, ts, taskID) {
		if first.IsZero() || e.At.Before(first) {
			first = e.At
		}
	}
	return first
}

// TestDispatchDailyCapSaysWhyAndWakesOnEdit: with daily_cap 40 and 100
// recipients, 40 are sent and progress says why the rest wait within 2 s
// of the cap being reached; raising the cap with a KV edit sends the rest
// within 5 s (they were scheduled for when the oldest send leaves the
// 24 h window before).
func TestDispatchDailyCapSaysWhyAndWakesOnEdit(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	fields := `"rate_per_sec":100,"burst":10,"concurrency":4,"daily_cap":%d`
	ts.PutAccount(t, "cap-a", harness.WebhookAccount(rec.URL, fmt.Sprintf(fields, 40)))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	task := contract.Task{ID: "capwake", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("w", 100)}
	harness.Submit(t, ts, task)

	p := ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool {
		return strings.Contains(p.Error, "daily_cap 40 reached")
	}, "progress says the daily cap holds the rest")
	said := time.Now()
	reached := capReachedAt(t, ts, task.ID)
	time.Sleep(500 * time.Millisecond)
	p = ts.Progress(t, task.ID)
	t.Logf("cap reached %s, progress said so %s later: sent %d retrying %d error %q",
		reached.Format("15:04:05.000"), said.Sub(reached).Round(time.Millisecond), p.Sent, p.Retrying, p.Error)
	require.Less(t, said.Sub(reached), 2*time.Second, "the reason shows within 2 s")
	require.Equal(t, 40, p.Sent)
	require.Equal(t, 60, p.Retrying)
	require.Contains(t, p.Error, "daily_cap 40 reached", "the reason stays while recipients wait")

	edited := time.Now()
	ts.PutAccount(t, "cap-a", harness.WebhookAccount(rec.URL, fmt.Sprintf(fields, 200)))
	p = ts.WaitFinal(t, task.ID, 15*time.Second)
	acc := rec.Accepted()
	last := acc[len(acc)-1].At
	t.Logf("cap raised to 200: the remaining 60 sent %s after the edit; state %s sent %d, error %q",
		last.Sub(edited).Round(time.Millisecond), p.State, p.Sent, p.Error)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 100, p.Sent)
	require.Empty(t, p.Error)
	require.Less(t, last.Sub(edited), 5*time.Second, "waiting recipients come back within 5 s")
	l := gw.Ledger()
	require.Equal(t, 100, l.AcceptedKeys())
	require.Zero(t, l.Duplicates)
}

// TestDispatchDailyCapMovesToCapacity: a pool of two accounts with
// daily_cap 60 each and 120 recipients. Render splits the recipients by
// hash, not exactly 60/60; the recipients queued on an account beyond its
// cap move to the other one, which still has capacity, instead of waiting
// a day, and neither account sends beyond its cap.
func TestDispatchDailyCapMovesToCapacity(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gwA, recA := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	gwB, recB := harness.StartRecordedGateway(t, gateway.Config{Seed: 2}, 0)
	ts.PutAccount(t, "cm-a", harness.WebhookAccount(recA.URL, `"rate_per_sec":200,"burst":10,"concurrency":4,"daily_cap":60`))
	ts.PutAccount(t, "cm-b", harness.WebhookAccount(recB.URL, `"rate_per_sec":200,"burst":10,"concurrency":4,"daily_cap":60`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	task := contract.Task{ID: "capmove", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"cm-a", "cm-b"}, Recipients: pipelinetest.Recipients("m", 120)}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 30*time.Second)
	la, lb := gwA.Ledger(), gwB.Ledger()
	t.Logf("pool of two capped accounts: cm-a sent %d, cm-b sent %d (caps 60 each); %d daily_cap waits; state %s",
		la.AcceptedKeys(), lb.AcceptedKeys(), len(capWaits(t, ts, task.ID)), p.State)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 120, p.Sent)
	require.Equal(t, 60, la.AcceptedKeys())
	require.Equal(t, 60, lb.AcceptedKeys())
	require.Zero(t, la.Duplicates+lb.Duplicates)
}

// TestDispatchHeldJobsWakeWhenAccountEnabled: the only enabled account of
// a pool reaches its cap, so the rest wait; enabling the pool's second
// account sends them within 5 s.
func TestDispatchHeldJobsWakeWhenAccountEnabled(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	_, recA := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	gwB, recB := harness.StartRecordedGateway(t, gateway.Config{Seed: 2}, 0)
	ts.PutAccount(t, "en-a", harness.WebhookAccount(recA.URL, `"rate_per_sec":100,"burst":10,"concurrency":4,"daily_cap":20`))
	off := `"rate_per_sec":100,"burst":10,"concurrency":4,"enabled":false`
	ts.PutAccount(t, "en-b", harness.WebhookAccount(recB.URL, off))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	task := contract.Task{ID: "enwake", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"en-a", "en-b"}, Recipients: pipelinetest.Recipients("e", 60)}
	harness.Submit(t, ts, task)
	p := ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Sent == 20 && p.Retrying == 40 && strings.Contains(p.Error, "daily_cap")
	}, "20 sent, 40 waiting for the cap")
	enabled := time.Now()
	ts.PutAccount(t, "en-b", harness.WebhookAccount(recB.URL, strings.Replace(off, "false", "true", 1)))
	p = ts.WaitFinal(t, task.ID, 15*time.Second)
	acc := recB.Accepted()
	require.NotEmpty(t, acc)
	last := acc[len(acc)-1].At
	t.Logf("second account enabled: %d sent through it, the last %s after the edit; state %s",
		len(acc), last.Sub(enabled).Round(time.Millisecond), p.State)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 40, gwB.Ledger().AcceptedKeys())
	require.Less(t, last.Sub(enabled), 5*time.Second)
}
