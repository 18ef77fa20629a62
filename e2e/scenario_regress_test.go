package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// Regression tests for the bugs the scenario tester found (its seeds 15
// and 8 replay them with everything else going on).

// TestCancelWhileScheduledStartWaits: the scheduled start fires a second
// before send_at and waits; a cancel in that second must win, and nothing
// may be sent (it used to be overwritten: the task was sent anyway).
func TestCancelWhileScheduledStartWaits(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	// send_at is whole seconds (RFC 3339): pick one 2-3 s ahead and cancel
	// half a second before it, inside the start's one-second lead.
	sendAt := time.Now().Add(3 * time.Second).Truncate(time.Second)
	harness.Submit(t, ts, contract.Task{ID: "sched-cancel", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("c", 20), SendAt: sendAt.UTC().Format(time.RFC3339)})
	ts.WaitProgress(t, "sched-cancel", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateScheduled })
	time.Sleep(time.Until(sendAt.Add(-400 * time.Millisecond)))
	require.True(t, harness.Control(t, ts, "sched-cancel", contract.ActionCancel).OK)
	p := ts.WaitFinal(t, "sched-cancel", 10*time.Second)
	require.Equal(t, contract.StateCancelled, p.State)
	time.Sleep(time.Until(sendAt.Add(time.Second)))
	require.Zero(t, gw.Ledger().Requests, "a cancelled scheduled task sends nothing")
	require.Equal(t, 20, ts.Progress(t, "sched-cancel").Cancelled)
}

// TestApprovalWhileScheduledStartWaits: a scheduled task with test
// recipients, started early by a resume and approved while its scheduled
// start waits out the last second before send_at, must stay approved. The
// start, which had read "scheduled" before its wait, sent the task back
// to awaiting approval once send_at came, and it was never sent
// (multi-process scenario seed 77967254).
func TestApprovalWhileScheduledStartWaits(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":20,"burst":1,"concurrency":4}`, gw.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	// 40 recipients at 20/s: still sending when send_at comes.
	sendAt := time.Now().Add(3 * time.Second).Truncate(time.Second)
	harness.Submit(t, ts, contract.Task{ID: "sched-approve", Channel: "webhook", Template: "x", Recipients: pipelinetest.Recipients("a", 40),
		TestRecipients: []contract.Recipient{{To: "qa-1"}}, SendAt: sendAt.UTC().Format(time.RFC3339)})
	ts.WaitProgress(t, "sched-approve", 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateScheduled })
	time.Sleep(time.Until(sendAt.Add(-400 * time.Millisecond)))
	require.Equal(t, contract.StateAwaitingApproval, harness.Control(t, ts, "sched-approve", contract.ActionResume).State, "a resume starts it now")
	require.Equal(t, contract.StateProcessing, harness.Control(t, ts, "sched-approve", contract.ActionResume).State, "a second resume approves it")
	p := ts.WaitFinal(t, "sched-approve", 15*time.Second)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 40, p.Sent)
	time.Sleep(time.Until(sendAt.Add(time.Second)))
	require.Equal(t, contract.StateSucceeded, ts.Progress(t, "sched-approve").State, "still succeeded after send_at")
	require.Equal(t, 41, gw.Ledger().AcceptedKeys(), "every recipient and the test recipient, each once")
}

// TestRetryDeadFailsAgain: a dead letter re-queued by retry-dead that
// fails again is counted failed again, and the task becomes final (its
// failed event used to be dropped as a duplicate of the first one).
func TestRetryDeadFailsAgain(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	g := harness.StartGateway(t, gateway.Config{Seed: 1, PermanentPrefix: "bad-"})
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10,"concurrency":8}`, g.URL))
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	rs := append(pipelinetest.Recipients("ok", 5), contract.Recipient{To: "bad-1"}, contract.Recipient{To: "bad-2"})
	harness.Submit(t, ts, contract.Task{ID: "redead", Channel: "webhook", Template: "x", Recipients: rs})
	p := ts.WaitFinal(t, "redead", 15*time.Second)
	require.Equal(t, 2, p.Failed)
	rep := harness.Control(t, ts, "redead", contract.ActionRetryDead)
	require.Equal(t, 2, rep.Requeued)
	harness.WaitCount(t, 10*time.Second, 4, func() int { return g.Ledger().RequestsByKey["redead.5"] + g.Ledger().RequestsByKey["redead.6"] }, "bad recipients sent again")
	time.Sleep(1500 * time.Millisecond) // status folds the re-queue and the new failures
	p = ts.WaitProgress(t, "redead", 10*time.Second, func(p *contract.Progress) bool { return p.State.Final() && p.Failed == 2 })
	require.Equal(t, 5, p.Sent)
}
