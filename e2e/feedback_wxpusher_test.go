package e2e

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/services/feedback"
)

// TestFeedbackWxPusherPoller sends through a WxPusher account whose
// endpoint is the stand-in, which answers status queries by recipient:
// index%3 == 0 delivered, 1 failed, 2 not known yet, then sending, then
// delivered. Progress gets exactly those counts, each final status is
// queried once (pending ones until final), and the poller never exceeds
// the app's rate in any second.
func TestFeedbackWxPusherPoller(t *testing.T) {
	t.Parallel()
	const (
		token   = "AT_wxpoll-app-token-secret"
		n       = 15
		perSec  = 2.0
		account = "wxp"
	)
	plan := func(uid string) []feedbacktest.WxAnswer {
		var i int
		_, _ = fmt.Sscanf(uid, "UID_poll%03d", &i)
		switch i % 3 {
		case 0:
			return []feedbacktest.WxAnswer{feedbacktest.WxDelivered}
		case 1:
			return []feedbacktest.WxAnswer{feedbacktest.WxFailed}
		}
		return []feedbacktest.WxAnswer{feedbacktest.WxNotKnown, feedbacktest.WxPending, feedbacktest.WxDelivered}
	}
	wx := feedbacktest.StartWxPusher(token, plan)
	t.Cleanup(wx.Close)
	var logs logtest.Buffer
	st := startFeedbackStack(t, map[string]string{"BROADCAST_SECRET_WXP": token}, func(c *feedback.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.WxPusherRate = perSec
		c.WxPusherFirstPoll = 300 * time.Millisecond
		c.WxPusherMaxPollDelay = time.Second
	})
	// Sends one recipient per call, so the sends are not what is measured.
	st.cs.PutAccount(t, account, fmt.Sprintf(`{"channel":"wxpusher","endpoint":%q,"secret_env":"BROADCAST_SECRET_WXP",`+
		`"rate_per_sec":200,"burst":20,"concurrency":4,"max_batch":1}`, wx.URL))

	task := contract.Task{ID: "fb-wxpoll", Channel: "wxpusher", Template: "Order {{.to}} shipped"}
	for i := range n {
		task.Recipients = append(task.Recipients, contract.Recipient{To: fmt.Sprintf("UID_poll%03d", i)})
	}
	harness.Submit(t, st.cs.Server, task)
	require.Equal(t, contract.StateSucceeded, st.cs.WaitFinal(t, task.ID, 60*time.Second).State)

	// 10 delivered (5 at once, 5 after waiting), 5 undelivered.
	p := st.cs.WaitProgress(t, task.ID, 60*time.Second, func(p *contract.Progress) bool {
		return p.Delivered == 10 && p.Undelivered == 5
	}, "delivered 10 undelivered 5")
	require.Equal(t, n, p.Sent)
	require.Zero(t, p.Read)

	// A final status is asked for once; pending ones until final.
	for i := range n {
		uid := fmt.Sprintf("UID_poll%03d", i)
		want := 1
		if i%3 == 2 {
			want = 3
		}
		require.Equal(t, want, wx.Asked(uid), "status queries for %s", uid)
	}
	queries := wx.Queries()
	require.Len(t, queries, 5+5+5*3)
	require.Equal(t, int64(len(queries)), st.fb.Stats().Polls)
	require.Zero(t, wx.Refused(), "every query carried the app's token")
	// The limiter spaces calls 1/perSec apart, so a window of 2 s holds at
	// most 2×perSec+1 of them; that bound leaves room for the requests'
	// own jitter on the way to the stand-in on a loaded machine, where
	// one late arrival could put perSec+1 inside a second.
	require.LessOrEqual(t, feedbacktest.MaxInWindow(queries, 2*time.Second), 2*int(perSec)+1,
		"queries per second: %v", feedbacktest.PerSecond(queries))
	busiest := 0
	for _, c := range feedbacktest.PerSecond(queries) {
		busiest = max(busiest, c)
	}
	t.Logf("%d status queries over %s, at most %d in a wall-clock second (rate %g/s)",
		len(queries), queries[len(queries)-1].Sub(queries[0]).Round(time.Millisecond), busiest, perSec)

	evs := st.cs.Events(t, task.ID)
	for _, ev := range harness.EventsOf(evs, contract.EventUndelivered) {
		require.Equal(t, "failed", ev.Code)
		require.Equal(t, "发送失败:用户已取消关注", ev.Error)
		require.Equal(t, account, ev.Account)
		require.Equal(t, 1, ev.Attempt)
		require.True(t, strings.HasPrefix(ev.ProviderID, "88"), ev.ProviderID)
	}
	require.Len(t, harness.EventsOf(evs, contract.EventDelivered), 10)
	m := st.samples(t)
	require.Equal(t, 15.0, m.Sum("broadcast_feedback_receipts_total", "source", "wxpusher", "result", "stored"))
	require.Equal(t, 15.0, m.Sum("broadcast_feedback_receipts_total", "source", "wxpusher", "result", "event"))

	for _, stream := range []string{contract.StreamReceipts, "KV_" + contract.BucketProviderIDs} {
		requireNoSecret(t, stream, strings.Join(streamMessages(t, st.cs.Server, stream), "\n"), token)
	}
	requireNoSecret(t, "feedback's log", logs.String(), token)
	requireNoSecret(t, "the server's log", strings.Join(st.cs.Log.Lines(), "\n"), token)
	require.Empty(t, st.cs.Log.Violations(), "permission violations")
}

// TestFeedbackWxPusherPollerRestart stops feedback while sends are still
// pending at WxPusher and starts it again: the durable consumer hands the
// pending sends to the new process, and the counts come out exact.
func TestFeedbackWxPusherPollerRestart(t *testing.T) {
	t.Parallel()
	const (
		token  = "AT_wxpoll-restart-token"
		n      = 9
		perSec = 4.0
	)
	wx := feedbacktest.StartWxPusher(token, func(uid string) []feedbacktest.WxAnswer {
		var i int
		_, _ = fmt.Sscanf(uid, "UID_rs%03d", &i)
		if i%3 == 1 {
			return []feedbacktest.WxAnswer{feedbacktest.WxPending, feedbacktest.WxFailed}
		}
		return []feedbacktest.WxAnswer{feedbacktest.WxNotKnown, feedbacktest.WxPending, feedbacktest.WxPending, feedbacktest.WxDelivered}
	})
	t.Cleanup(wx.Close)
	st := startFeedbackStack(t, map[string]string{"BROADCAST_SECRET_WXP": token}, func(c *feedback.Config) {
		c.WxPusherRate = perSec
		c.WxPusherFirstPoll = 200 * time.Millisecond
		c.WxPusherMaxPollDelay = 500 * time.Millisecond
	})
	st.cs.PutAccount(t, "wxr", fmt.Sprintf(`{"channel":"wxpusher","endpoint":%q,"secret_env":"BROADCAST_SECRET_WXP",`+
		`"rate_per_sec":200,"burst":20,"concurrency":4,"max_batch":1}`, wx.URL))
	task := contract.Task{ID: "fb-wxrestart", Channel: "wxpusher", Template: "Hi"}
	for i := range n {
		task.Recipients = append(task.Recipients, contract.Recipient{To: fmt.Sprintf("UID_rs%03d", i)})
	}
	harness.Submit(t, st.cs.Server, task)
	natstest.Eventually(t, 30*time.Second, func() bool { return len(wx.Queries()) >= 6 }, "polling started")
	st.stop()
	before := len(wx.Queries())
	p := st.cs.Progress(t, task.ID)
	require.Less(t, p.Delivered+p.Undelivered, n, "sends still pending when feedback stopped")
	time.Sleep(time.Second)
	require.Equal(t, before, len(wx.Queries()), "a stopped feedback polls no more")
	st.restart(t)

	p = st.cs.WaitProgress(t, task.ID, 60*time.Second, func(p *contract.Progress) bool {
		return p.Delivered == 6 && p.Undelivered == 3
	}, "delivered 6 undelivered 3")
	require.Equal(t, n, p.Sent)
	require.Positive(t, st.fb.Stats().Polls, "the new process polled what was left")
	require.LessOrEqual(t, feedbacktest.MaxInWindow(wx.Queries(), 2*time.Second), 2*int(perSec)+1,
		"queries per second: %v", feedbacktest.PerSecond(wx.Queries()))
	require.Len(t, harness.EventsOf(st.cs.Events(t, task.ID), contract.EventDelivered), 6)
}
