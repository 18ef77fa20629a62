package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// chartState is what a chart's SVG says it drew.
type chartState struct {
	Points    int     `json:"points"`
	SumSent   float64 `json:"sumSent"`
	SumFailed float64 `json:"sumFailed"`
	Lines     int     `json:"lines"`
	Start     string  `json:"start"`
}

func readChart(t *testing.T, ctx context.Context, sel string) chartState {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := chromedp.Run(ctx, chromedp.Evaluate[chartState](fmt.Sprintf(`(() => {
		const s = document.querySelector(%q);
		return {points: Number(s.dataset.points || 0), sumSent: Number(s.dataset.sumSent || 0),
			sumFailed: Number(s.dataset.sumFailed || 0), lines: s.querySelectorAll('polyline').length, start: s.dataset.start || ''};
	})()`, sel)))
	require.NoError(t, err)
	return c
}

func evalJS[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	require.NoError(t, err, js)
	return v
}

// waitJS polls js in the page until it returns true.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, js string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !evalJS[bool](t, ctx, js) {
		if time.Now().After(deadline) {
			require.FailNow(t, "the page did not show "+what, "after %s: %s", timeout, js)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOperatorPagesInABrowser loads the operator's pages in headless
// chromium while a paced task with permanent failures runs: the task's
// chart draws and grows, the story page lists the failures grouped and
// every dead letter, a retry of two selected letters from the page
// re-sends exactly those two (the gateway's own ledger), the account page
// charts the account, and the lookup page finds a recipient.
func TestOperatorPagesInABrowser(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	o := startOperatorSetup(t, 25)
	const n = 100
	rs, bad := pipelinetest.RecipientsWithRejects(n, 10, 3) // bad-0003, bad-0013, ...
	harness.Submit(t, o.ts, contract.Task{ID: "story", Channel: "webhook", Template: "hi {{.to}}", Recipients: rs})
	o.ts.WaitProgress(t, "story", 10*time.Second, func(p *contract.Progress) bool { return p.Sent > 0 })

	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(o.url+"tasks/story"), chromedp.WaitVisible(chromedp.CSS(`#chart-seconds polyline`))))
	cancel()
	first := readChart(t, browser, "#chart-seconds")
	time.Sleep(1500 * time.Millisecond)
	second := readChart(t, browser, "#chart-seconds")
	t.Logf("chart: %+v, then %+v 1.5 s later", first, second)
	require.Greater(t, first.Points, 0)
	require.GreaterOrEqual(t, second.Lines, 3, "sent, retrying and failed are drawn")
	require.Greater(t, second.SumSent, first.SumSent, "the chart moves while the task runs")
	require.Less(t, second.SumSent, float64(n-bad), "paced at 25/s, the task is still running")
	screenshot(t, browser, "task-story-running")

	final := o.ts.WaitFinal(t, "story", 30*time.Second)
	require.Equal(t, contract.StatePartial, final.State)
	require.Equal(t, bad, final.Failed)
	waitJS(t, browser, 10*time.Second, "every dead letter", fmt.Sprintf(`document.querySelectorAll('#dead tbody tr').length === %d`, bad))
	require.Equal(t, fmt.Sprint(bad), evalJS[string](t, browser, `document.querySelector('#dead-total').dataset.total`))
	tos := evalJS[[]string](t, browser, `[...document.querySelectorAll('#dead tbody tr')].map((r) => r.dataset.to)`)
	for _, to := range tos {
		require.True(t, strings.HasPrefix(to, "bad-"), to)
	}
	// The groups are reloaded at most every five seconds.
	waitJS(t, browser, 10*time.Second, "the failures in one group", fmt.Sprintf(`(() => {
		const g = [...document.querySelectorAll('#failures tbody tr')].map((r) => r.dataset.kind + '/' + r.dataset.account + '/' + r.dataset.count);
		return g.length === 1 && g[0] === 'failed/hook/%d';
	})()`, bad))
	waitJS(t, browser, 5*time.Second, "the final chart", fmt.Sprintf(`Number(document.querySelector('#chart-seconds').dataset.sumSent) === %d`, n-bad))
	require.Equal(t, float64(bad), readChart(t, browser, "#chart-seconds").SumFailed)
	screenshot(t, browser, "task-story-dead-letters")

	// Retry the second and fifth dead letter from the page.
	page, err := client.DeadLetters(t.Context(), o.ts.JS, "story", 0, 50)
	require.NoError(t, err)
	keys := make([]string, len(page.Letters))
	for i, l := range page.Letters {
		keys[i] = l.JobID
	}
	before := requestsByKey(o.gw, keys)
	evalJS[bool](t, browser, `(() => { const b = document.querySelectorAll('#dead tbody input[type=checkbox]'); b[1].click(); b[4].click(); return true; })()`)
	ctx, cancel = context.WithTimeout(browser, 10*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#retry-selected`))))
	cancel()
	waitJS(t, browser, 10*time.Second, "the retry's reply", `document.querySelector('#retry-reply').dataset.requeued === '2'`)
	require.Equal(t, "re-queued 2", evalJS[string](t, browser, `document.querySelector('#retry-reply').textContent`))
	want := map[string]int{}
	for i, k := range keys {
		want[k] = before[k]
		if i == 1 || i == 4 {
			want[k]++
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for got := requestsByKey(o.gw, keys); !equalCounts(got, want); got = requestsByKey(o.gw, keys) {
		require.False(t, time.Now().After(deadline), "gateway requests per dead letter: got %v, want %v", got, want)
		time.Sleep(100 * time.Millisecond)
	}
	o.ts.WaitProgress(t, "story", 15*time.Second, func(p *contract.Progress) bool { return p.State.Final() && p.Failed == bad })
	time.Sleep(time.Second) // nothing else is sent
	require.Equal(t, want, requestsByKey(o.gw, keys), "exactly the two selected were re-sent, once each")
	require.Equal(t, n-bad, o.gw.Ledger().AcceptedKeys(), "and nothing else")
	waitJS(t, browser, 10*time.Second, "the dead letters again", fmt.Sprintf(`document.querySelectorAll('#dead tbody tr').length === %d`, bad))
	screenshot(t, browser, "task-story-retried")

	// Its events, filtered to the failed ones: the first six, and the two retried.
	ctx, cancel = context.WithTimeout(browser, 10*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#event-kind`), "failed")))
	cancel()
	evalJS[bool](t, browser, `document.querySelector('#event-kind').dispatchEvent(new Event('change'))`)
	waitJS(t, browser, 10*time.Second, "the failed events", fmt.Sprintf(`(() => { const r = [...document.querySelectorAll('#events tbody tr')]; return r.length === %d && r.every((x) => x.dataset.kind === 'failed'); })()`, bad+2))

	// The account page charts the account's sends and its rate.
	ctx, cancel = context.WithTimeout(browser, 20*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(o.url+"account.html?name=hook"), chromedp.WaitVisible(chromedp.CSS(`#chart-rate polyline`))))
	cancel()
	waitJS(t, browser, 5*time.Second, "the account's sends", fmt.Sprintf(`Number(document.querySelector('#chart-sends').dataset.sumSent) === %d`, n-bad))
	require.Greater(t, evalJS[float64](t, browser, `Number(document.querySelector('#chart-rate').dataset.sumCeiling)`), 0.0, "the ceiling is drawn")
	require.Greater(t, evalJS[int](t, browser, `Number(document.querySelector('#chart-daily').dataset.points)`), 0, "the daily window is drawn")
	screenshot(t, browser, "account")

	// The lookup page finds a sent and a failed recipient.
	ctx, cancel = context.WithTimeout(browser, 20*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(o.url+"lookup.html"), chromedp.WaitVisible(chromedp.CSS(`#to`)),
		chromedp.SendKeys(chromedp.CSS(`#to`), "  "+rs[0].To+" "), chromedp.Click(chromedp.CSS(`#lookup-go`))))
	cancel()
	waitJS(t, browser, 10*time.Second, "the recipient's outcome", `(() => { const r = document.querySelectorAll('#entries tbody tr'); return r.length === 1 && r[0].dataset.kind === 'sent' && r[0].dataset.task === 'story'; })()`)
	screenshot(t, browser, "lookup")
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
