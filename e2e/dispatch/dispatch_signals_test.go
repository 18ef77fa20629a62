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
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// retryingWith returns a task's retrying events with code.
func retryingWith(t *testing.T, ts *pipelinetest.Server, taskID, code string) map[string]contract.Event {
	t.Helper()
	out := map[string]contract.Event{}
	for _, e := range harness.EventsOf(ts.Events(t, taskID), contract.EventRetrying) {
		if e.Code == code {
			out[e.JobID] = e
		}
	}
	return out
}

// countPrefix counts the accepted distinct recipients starting with prefix.
func countPrefix(rec *harness.Recorder, prefix string) int {
	n := 0
	for to := range distinctAccepted(rec) {
		if strings.HasPrefix(to, prefix) {
			n++
		}
	}
	return n
}

// TestDispatchQualityRating: YELLOW halves the account's ceiling; RED
// halves it and holds its marketing sends (retrying, code quality_red,
// nothing reaches the provider) while a transactional task goes through;
// GREEN restores the ceiling and the held marketing recipients are sent.
func TestDispatchQualityRating(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	ts.PutAccount(t, "q", harness.WebhookAccount(rec.URL, `"rate_per_sec":40,"burst":4,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})

	ceiling := func() float64 {
		if h := harness.AccountHealth(t, ts, "q"); h != nil {
			return h.Ceiling
		}
		return 0
	}
	// One send first, so dispatch runs the account and has written its
	// health: the signals below arrive as changes.
	first := contract.Task{ID: "q-first", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("f", 1)}
	harness.Submit(t, ts, first)
	require.Equal(t, contract.StateSucceeded, ts.WaitFinal(t, first.ID, 20*time.Second).State)
	natstest.Eventually(t, 10*time.Second, func() bool { return ceiling() == 40 }, "health written with the ceiling 40")
	harness.PutSignals(t, ts, "q", contract.AccountSignals{Quality: contract.QualityYellow, Source: "test"})
	natstest.Eventually(t, 10*time.Second, func() bool { return ceiling() == 20 }, "YELLOW halves the ceiling 40 to 20")
	warm := contract.Task{ID: "q-yellow", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("y", 40)}
	start := time.Now()
	harness.Submit(t, ts, warm)
	require.Equal(t, contract.StateSucceeded, ts.WaitFinal(t, warm.ID, 30*time.Second).State)
	took := time.Since(start)
	t.Logf("YELLOW: 40 recipients at ceiling %.0f/s took %s", ceiling(), took.Round(time.Millisecond))
	require.Greater(t, took, 1500*time.Millisecond, "40 recipients at 20/s (burst 4) need about 1.8 s, not the 0.9 s of 40/s")

	harness.PutSignals(t, ts, "q", contract.AccountSignals{Quality: contract.QualityRed, Event: "FLAGGED", Source: "test"})
	natstest.Eventually(t, 10*time.Second, func() bool {
		h := harness.AccountHealth(t, ts, "q")
		return h != nil && h.MarketingHeld && h.Ceiling == 20
	}, "RED holds marketing in health")
	mkt := contract.Task{ID: "q-mkt", Channel: "webhook", Template: "sale {{.to}}", Recipients: pipelinetest.Recipients("m", 10)}
	txn := contract.Task{ID: "q-txn", Channel: "webhook", Template: "code {{.to}}", Category: contract.CategoryTransactional,
		Recipients: pipelinetest.Recipients("t", 10)}
	harness.Submit(t, ts, mkt)
	harness.Submit(t, ts, txn)
	require.Equal(t, contract.StateSucceeded, ts.WaitFinal(t, txn.ID, 20*time.Second).State, "transactional goes on under RED")
	ts.WaitProgress(t, mkt.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Retrying == 10 && len(retryingWith(t, ts, mkt.ID, contract.CodeQualityRed)) == 10
	}, "the 10 marketing recipients wait with code quality_red")
	time.Sleep(500 * time.Millisecond) // a wrongly sent marketing job would show now
	held := retryingWith(t, ts, mkt.ID, contract.CodeQualityRed)
	var sample contract.Event
	for _, ev := range held {
		sample = ev
	}
	t.Logf("RED: transactional sent %d, marketing sent %d, held %d, e.g. %q", countPrefix(rec, "t-"), countPrefix(rec, "m-"), len(held), sample.Error)
	require.Zero(t, countPrefix(rec, "m-"), "no marketing send under RED")
	require.Equal(t, 10, countPrefix(rec, "t-"))
	require.Contains(t, sample.Error, "quality rating RED")
	require.Equal(t, contract.StateProcessing, ts.Progress(t, mkt.ID).State)

	harness.PutSignals(t, ts, "q", contract.AccountSignals{Quality: contract.QualityGreen, Event: "UNFLAGGED", Source: "test"})
	p := ts.WaitFinal(t, mkt.ID, 20*time.Second)
	t.Logf("GREEN: marketing task %s, sent %d; ceiling %.0f", p.State, p.Sent, ceiling())
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 10, countPrefix(rec, "m-"))
	require.Len(t, rec.Accepted(), 61, "every recipient sent once")
	natstest.Eventually(t, 10*time.Second, func() bool { return ceiling() == 40 }, "GREEN restores the ceiling")
}

// TestDispatchPortfolioLimit: two accounts of one portfolio share the
// messaging limit reported for one of them: 20 distinct recipients over
// both, the rest wait with the portfolio named; a recipient reached by one
// account takes no new slot when the other sends to it.
func TestDispatchPortfolioLimit(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	for _, name := range []string{"pa", "pb"} {
		ts.PutAccount(t, name, harness.WebhookAccount(rec.URL, `"rate_per_sec":200,"burst":20,"concurrency":4,"portfolio":"biz"`))
	}
	harness.PutSignals(t, ts, "pa", contract.AccountSignals{MessagingLimit: 20, Tier: "TIER_20", Source: "test"})
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})

	task := contract.Task{ID: "pf-1", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("p", 30)}
	harness.Submit(t, ts, task)
	ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Sent == 20 && p.Retrying == 10 && len(capWaits(t, ts, task.ID)) == 10
	}, "20 sent over the portfolio, 10 waiting")
	time.Sleep(500 * time.Millisecond)
	byAccount := map[string]int{}
	for _, ev := range harness.EventsOf(ts.Events(t, task.ID), contract.EventSent) {
		byAccount[ev.Account]++
	}
	var sample contract.Event
	for _, ev := range capWaits(t, ts, task.ID) {
		sample = ev
	}
	t.Logf("portfolio limit 20 over two accounts: accepted %d distinct, sent by account %v; e.g. %q", len(distinctAccepted(rec)), byAccount, sample.Error)
	require.Len(t, distinctAccepted(rec), 20)
	require.Len(t, rec.Accepted(), 20)
	require.Equal(t, 20, byAccount["pa"]+byAccount["pb"])
	require.Contains(t, sample.Error, "portfolio biz")

	// Counted recipients go again through either account.
	var again []contract.Recipient
	for to := range distinctAccepted(rec) {
		if len(again) < 10 {
			again = append(again, contract.Recipient{To: to})
		}
	}
	t2 := contract.Task{ID: "pf-2", Channel: "webhook", Template: "again {{.to}}", Recipients: again}
	harness.Submit(t, ts, t2)
	p2 := ts.WaitFinal(t, t2.ID, 20*time.Second)
	require.Equal(t, contract.StateSucceeded, p2.State)
	require.Len(t, distinctAccepted(rec), 20, "no new recipient beyond the portfolio's limit")
	// Written soon after the session's first sends, then every
	// HealthInterval while the account sends.
	h := harness.WaitAccountHealth(t, ts, "pa", func(h *contract.AccountHealth) bool { return h.PortfolioCap > 0 })
	t.Logf("health of pa: portfolio %s used %d of %d", h.Portfolio, h.PortfolioUsed, h.PortfolioCap)
	require.Equal(t, "biz", h.Portfolio)
	require.Equal(t, 20, h.PortfolioCap)
}

// TestDispatchWarmupAndMessagingLimit: a warm-up ramp starting today caps
// the account at its start; a reported messaging limit below it then
// takes over (the lowest cap applies), and the reason names it.
func TestDispatchWarmupAndMessagingLimit(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	today := time.Now().UTC().Format(time.DateOnly)
	ts.PutAccount(t, "new", harness.WebhookAccount(rec.URL, fmt.Sprintf(`"rate_per_sec":200,"burst":20,"concurrency":4,"daily_cap":100,`+
		`"warmup":{"start":15,"growth":1.4,"max":1000,"since":%q}`, today)))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})

	task := contract.Task{ID: "wu-1", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("w", 20)}
	harness.Submit(t, ts, task)
	ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Sent == 15 && p.Retrying == 5 && len(capWaits(t, ts, task.ID)) == 5
	}, "15 sent on warm-up day 0, 5 waiting")
	var sample contract.Event
	for _, ev := range capWaits(t, ts, task.ID) {
		sample = ev
	}
	h := harness.WaitAccountHealth(t, ts, "new", func(h *contract.AccountHealth) bool { return h.WarmupCap > 0 })
	t.Logf("warm-up day 0: accepted %d; health daily %d/%d warmup_cap %d; e.g. %q", len(distinctAccepted(rec)), h.DailyUsed, h.DailyCap, h.WarmupCap, sample.Error)
	require.Len(t, distinctAccepted(rec), 15)
	require.Contains(t, sample.Error, "warm-up cap 15 (day 0) reached on account new")
	require.Equal(t, 15, h.WarmupCap)
	require.Equal(t, 15, h.DailyCap)

	harness.PutSignals(t, ts, "new", contract.AccountSignals{MessagingLimit: 10, Tier: "TIER_10", Source: "test"})
	natstest.Eventually(t, 10*time.Second, func() bool {
		h := harness.AccountHealth(t, ts, "new")
		return h != nil && h.DailyCap == 10
	}, "the reported limit 10 becomes the cap")
	t2 := contract.Task{ID: "wu-2", Channel: "webhook", Template: "hi {{.to}}", Recipients: pipelinetest.Recipients("v", 3)}
	harness.Submit(t, ts, t2)
	ts.WaitProgress(t, t2.ID, 20*time.Second, func(p *contract.Progress) bool {
		return p.Retrying == 3 && len(capWaits(t, ts, t2.ID)) == 3
	}, "over the messaging limit: the 3 new recipients wait")
	for _, ev := range capWaits(t, ts, t2.ID) {
		sample = ev
	}
	t.Logf("messaging limit 10 below the warm-up cap: %q", sample.Error)
	require.Contains(t, sample.Error, "messaging limit 10 reached on account new")
	require.Len(t, distinctAccepted(rec), 15)
}
