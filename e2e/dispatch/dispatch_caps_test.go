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
	"github.com/broadcastd/broadcast/services/dispatch"
)

// distinctAccepted returns the distinct recipients the provider accepted.
func distinctAccepted(rec *harness.Recorder) map[string]bool {
	out := map[string]bool{}
	for _, h := range rec.Accepted() {
		out[h.To] = true
	}
	return out
}

// capWaits returns the distinct jobs of a task with a daily_cap retrying event.
func capWaits(t *testing.T, ts *pipelinetest.Server, taskID string) map[string]contract.Event {
	out := map[string]contract.Event{}
	for _, e := range harness.EventsOf(ts.Events(t, taskID), contract.EventRetrying) {
		if e.Code == "daily_cap" {
			out[e.JobID] = e
		}
	}
	return out
}

// TestDispatchDailyCap: an account with daily_cap 30 sends to exactly 30
// distinct recipients; the rest wait (retrying, code daily_cap), none fail.
// Recipients already counted are still sent to. The count is shared: a new
// dispatch replica that takes the account over is still capped.
func TestDispatchDailyCap(t *testing.T) {
	t.Parallel()
	const dailyCap = 30
	e := harness.NewDispatchEnv(t, dispatch.Config{})
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	e.TS.PutAccount(t, "capped", harness.WebhookAccount(rec.URL, fmt.Sprintf(`"rate_per_sec":100,"burst":10,"concurrency":4,"daily_cap":%d`, dailyCap)))
	first := e.StartReplica()

	// (a) 50 distinct recipients: 30 sent, 20 wait.
	t1 := contract.Task{ID: "cap-1", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("c", 50)}
	harness.Submit(t, e.TS, t1)
	p1 := e.TS.WaitProgress(t, t1.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Sent+p.Retrying == 50 && len(capWaits(t, e.TS, t1.ID)) == 20
	}, "30 sent and 20 waiting for the cap")
	time.Sleep(500 * time.Millisecond) // a wrongly admitted send would show now
	sent := distinctAccepted(rec)
	waits := capWaits(t, e.TS, t1.ID)
	p1 = e.TS.Progress(t, t1.ID)
	var sample contract.Event
	for _, ev := range waits {
		sample = ev
		break
	}
	t.Logf("(a) daily_cap %d, 50 recipients: gateway accepted %d distinct in %d requests; progress sent %d retrying %d failed %d state %s; e.g. %q",
		dailyCap, len(sent), len(rec.All()), p1.Sent, p1.Retrying, p1.Failed, p1.State, sample.Error)
	require.Len(t, sent, dailyCap)
	require.Len(t, rec.All(), dailyCap, "no request beyond the cap")
	require.Equal(t, dailyCap, p1.Sent)
	require.Equal(t, 50-dailyCap, p1.Retrying)
	require.Zero(t, p1.Failed)
	require.Empty(t, harness.EventsOf(e.TS.Events(t, t1.ID), contract.EventFailed))
	require.Equal(t, contract.StateProcessing, p1.State, "a reached cap delays, never finishes the task")
	require.Contains(t, sample.Error, "daily_cap 30 reached")
	for _, ev := range waits {
		require.False(t, sent[ev.To], "a waiting recipient was not sent")
	}

	// (a') 10 of the recipients already counted: sent, the cap is not used up further.
	var again []contract.Recipient
	for to := range sent {
		if len(again) < 10 {
			again = append(again, contract.Recipient{To: to})
		}
	}
	t2 := contract.Task{ID: "cap-2", Channel: "webhook", Template: "again {{.to}}", Recipients: again}
	harness.Submit(t, e.TS, t2)
	p2 := e.TS.WaitFinal(t, t2.ID, 20*time.Second)
	t.Logf("(a') 10 already-counted recipients: state %s, sent %d; distinct accepted now %d", p2.State, p2.Sent, len(distinctAccepted(rec)))
	require.Equal(t, contract.StateSucceeded, p2.State)
	require.Equal(t, 10, p2.Sent)
	require.Len(t, distinctAccepted(rec), dailyCap)

	// (b) The owning replica stops; a new one takes the account over and is
	// still capped: 5 counted recipients go, 10 new ones wait.
	first.Stop()
	e.StartReplica()
	var mixed []contract.Recipient
	for _, r := range again[:5] {
		mixed = append(mixed, r)
	}
	mixed = append(mixed, pipelinetest.Recipients("new", 10)...)
	t3 := contract.Task{ID: "cap-3", Channel: "webhook", Template: "third {{.to}}", Recipients: mixed}
	harness.Submit(t, e.TS, t3)
	p3 := e.TS.WaitProgress(t, t3.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Sent == 5 && p.Retrying == 10 && len(capWaits(t, e.TS, t3.ID)) == 10
	}, "after the handover: 5 counted recipients sent, 10 new ones waiting")
	time.Sleep(500 * time.Millisecond)
	newSent := 0
	for to := range distinctAccepted(rec) {
		if strings.HasPrefix(to, "new-") {
			newSent++
		}
	}
	h := harness.WaitAccountHealth(t, e.TS, "capped", nil)
	t.Logf("(b) after the handover to replica 2: sends per replica %v; task 3 sent %d retrying %d; new recipients accepted %d; distinct accepted %d; health daily_used %d/%d",
		e.SendsBy(), p3.Sent, p3.Retrying, newSent, len(distinctAccepted(rec)), h.DailyUsed, h.DailyCap)
	require.Zero(t, newSent, "the new owner knows the cap is reached")
	require.Len(t, distinctAccepted(rec), dailyCap, "never more than daily_cap distinct recipients")
	require.Equal(t, 5, e.SendsBy()[2], "the new owner sent only to counted recipients")
	require.Equal(t, dailyCap, h.DailyUsed)
	require.Equal(t, dailyCap, h.DailyCap)
}

// TestDispatchPerRecipientInterval: two tasks to the same recipient through
// one account with per_recipient_interval 2s reach the provider at least 2 s
// apart, while the other recipients are not held back.
func TestDispatchPerRecipientInterval(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	ts.PutAccount(t, "gap", harness.WebhookAccount(rec.URL, `"rate_per_sec":100,"burst":10,"concurrency":4,"per_recipient_interval":"2s"`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	for i := range 2 {
		task := contract.Task{ID: fmt.Sprintf("gap-%d", i), Channel: "webhook", Template: "n{{.n}} {{.to}}",
			Defaults: map[string]any{"n": i}, Recipients: append([]contract.Recipient{{To: "r1"}}, pipelinetest.Recipients(fmt.Sprintf("other%d", i), 5)...)}
		harness.Submit(t, ts, task)
	}
	for i := range 2 {
		p := ts.WaitFinal(t, fmt.Sprintf("gap-%d", i), 20*time.Second)
		require.Equal(t, contract.StateSucceeded, p.State)
	}
	r1 := harness.FilterHits(rec.Accepted(), func(h harness.Hit) bool { return h.To == "r1" })
	require.Len(t, r1, 2)
	gap := r1[1].At.Sub(r1[0].At)
	others := harness.FilterHits(rec.Accepted(), func(h harness.Hit) bool { return h.To != "r1" })
	spread := others[len(others)-1].At.Sub(others[0].At)
	t.Logf("per_recipient_interval 2s: the two sends to r1 were %s apart; the 10 other recipients went within %s",
		gap.Round(time.Millisecond), spread.Round(time.Millisecond))
	require.GreaterOrEqual(t, gap, 2*time.Second)
	require.Less(t, gap, 5*time.Second, "the delayed send comes back soon after the interval")
	require.Less(t, spread, time.Second, "other recipients are not held back")
}
