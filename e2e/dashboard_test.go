package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// chromiumPath finds the browser the dashboard test drives. Where it is
// missing the test is skipped with the install command, loudly, so that
// `go test ./...` passes on a fresh machine with Go alone; in CI, or with
// BROADCAST_REQUIRE_BROWSER set, a missing browser fails the test, since a
// skipped browser test would pass without testing anything.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	const msg = "chromium not found: the dashboard's browser test DID NOT RUN. " +
		"Install it with `apt-get update && apt-get install -y chromium` (.ci/run does)."
	if browserRequired() {
		t.Fatal(msg + " CI or BROADCAST_REQUIRE_BROWSER requires it.")
	}
	warnLoudly("WARNING: " + msg)
	t.Skip(msg)
	return ""
}

// warnLoudly writes msg where a person running `go test ./...` sees it:
// go test shows a passing package's output only with -v, so the message
// goes to the controlling terminal when there is one, and to stderr too.
func warnLoudly(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		fmt.Fprintln(tty, msg)
		_ = tty.Close()
	}
}

// browserRequired reports whether a missing browser must fail the test: in
// CI (CI set, as .ci/run does) or when BROADCAST_REQUIRE_BROWSER is set.
func browserRequired() bool {
	for _, name := range []string{"CI", "BROADCAST_REQUIRE_BROWSER"} {
		if v := os.Getenv(name); v != "" && v != "0" && v != "false" {
			return true
		}
	}
	return false
}

// newBrowser starts headless chromium with a fresh profile for the test and
// returns a tab's context.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	profile, err := os.MkdirTemp("", "broadcast-chromium-")
	require.NoError(t, err)
	// Chromium's helpers may still be writing as it exits; remove the profile
	// last and do not fail on leftovers.
	t.Cleanup(func() { _ = os.RemoveAll(profile) })
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1500, 900),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	// Start the browser now, on the test-long context, so later calls with
	// shorter timeouts do not tie the browser's life to theirs.
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// taskRow is what the page shows for one task.
type taskRow struct {
	Found bool   `json:"found"`
	State string `json:"state"`
	Total int    `json:"total"`
	Sent  int    `json:"sent"`
	Rate  string `json:"rate"`
	ETA   string `json:"eta"`
	Error string `json:"error"`
	Reply string `json:"reply"`
	// Buttons lists the visible buttons' actions.
	Buttons []string `json:"buttons"`
}

// readRow reads a task's row from the page (through the DOM, as a person
// would see it).
func readRow(t *testing.T, ctx context.Context, taskID string) taskRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	row, err := chromedp.Run(ctx, chromedp.Evaluate[taskRow](fmt.Sprintf(`(() => {
		const r = document.querySelector('tr[data-task=%q]');
		if (!r) return {found: false};
		const f = (name) => r.querySelector('[data-field="' + name + '"]');
		return {
			found: true,
			state: f('state').dataset.value,
			total: Number(f('total').dataset.value),
			sent: Number(f('sent').dataset.value),
			rate: f('rate').textContent,
			eta: f('eta').textContent,
			error: f('error').textContent,
			reply: f('reply').textContent,
			buttons: [...r.querySelectorAll('button')].filter((b) => !b.hidden).map((b) => b.dataset.action),
		};
	})()`, taskID)))
	require.NoError(t, err)
	return row
}

// waitRow polls the page until cond holds for the task's row.
func waitRow(t *testing.T, ctx context.Context, taskID string, timeout time.Duration, what string, cond func(taskRow) bool) taskRow {
	t.Helper()
	var row taskRow
	deadline := time.Now().Add(timeout)
	for {
		row = readRow(t, ctx, taskID)
		if row.Found && cond(row) {
			return row
		}
		if time.Now().After(deadline) {
			require.FailNowf(t, "dashboard did not show "+what, "after %s the row of %s is %+v", timeout, taskID, row)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func click(t *testing.T, ctx context.Context, taskID, action string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-task=%q] button[data-action=%q]`, taskID, action)))),
		"click %s", action)
}

// screenshot saves the whole page as name.png in DASHBOARD_SCREENSHOTS (when
// set, to keep it) or in the test's temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("DASHBOARD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(dir, name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// TestDashboardInABrowser loads the status service's dashboard in headless
// chromium while a slowly paced broadcast runs: the task's row advances
// live, Pause stops the sends (checked in KV broadcast_progress and at the
// gateway), Resume continues them, and markup in an error stays text.
func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":20,"burst":1,"concurrency":2}`, gw.URL))
	cfg := harness.FastRetries()
	cfg.Status.DashboardAddr = "127.0.0.1:0"
	cfg.Status.PollInterval = 500 * time.Millisecond
	reg := prometheus.NewRegistry()
	cfg.Ingest.Metrics, cfg.Render.Metrics, cfg.Dispatch.Metrics, cfg.Status.Metrics = reg, reg, reg, reg
	p := pipelinetest.StartPipeline(t, ts, cfg)
	natstest.Eventually(t, 10*time.Second, func() bool { return p.Status.DashboardURL() != "" })
	url := p.Status.DashboardURL()

	// A rejected task whose error quotes markup: the page must show it as text.
	harness.Submit(t, ts, `{"id":"xss","channel":"<img id=pwned src=x onerror=alert(1)>","template":"x","recipients":[{"to":"a"}]}`)
	const n = 400
	harness.Submit(t, ts, contract.Task{ID: "dash", Channel: "webhook", Template: "hello {{.to}}", Recipients: pipelinetest.Recipients("b", n)})

	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`tr[data-task="dash"]`))))
	cancel()
	live := waitRow(t, browser, "dash", 15*time.Second, "the task sending", func(r taskRow) bool {
		return r.State == "processing" && r.Sent > 0 && r.Total == n
	})
	require.Contains(t, live.Buttons, "pause")
	require.NotContains(t, live.Buttons, "resume")

	// The sent count advances while the page stays open.
	first := readRow(t, browser, "dash")
	time.Sleep(1500 * time.Millisecond)
	second := readRow(t, browser, "dash")
	t.Logf("page: sent %d, then %d 1.5 s later (rate %s, ETA %s)", first.Sent, second.Sent, second.Rate, second.ETA)
	require.Greater(t, second.Sent, first.Sent, "the sent count advances live")
	require.Less(t, second.Sent, n, "paced at 20/s, the task is still running")
	require.NotEqual(t, "–", second.Rate)

	xss := waitRow(t, browser, "xss", 10*time.Second, "the rejected task", func(r taskRow) bool { return r.State == "rejected" })
	require.Contains(t, xss.Error, "<img id=pwned", "markup in an error is shown as text")
	pwned, err := chromedp.Run(browser, chromedp.Evaluate[bool](`document.getElementById('pwned') !== null`))
	require.NoError(t, err)
	require.False(t, pwned, "markup in an error never becomes an element")
	screenshot(t, browser, "dashboard-running")

	// Pause: the page shows it, and sending stops.
	click(t, browser, "dash", "pause")
	pausedAt := time.Now()
	paused := waitRow(t, browser, "dash", 5*time.Second, "the task paused", func(r taskRow) bool { return r.State == "paused" })
	t.Logf("page showed paused %s after the click; reply %q", time.Since(pausedAt).Round(time.Millisecond), paused.Reply)
	require.Contains(t, paused.Reply, "pause: ok")
	require.Contains(t, paused.Buttons, "resume")
	require.NotContains(t, paused.Buttons, "pause")
	time.Sleep(1500 * time.Millisecond) // sends already started may finish
	atPause := ts.Progress(t, "dash")
	requests := gw.Ledger().Requests
	time.Sleep(2 * time.Second)
	still := ts.Progress(t, "dash")
	require.Equal(t, contract.StatePaused, still.State)
	require.Equal(t, atPause.Sent, still.Sent, "progress in KV shows nothing sent while paused")
	require.Equal(t, requests, gw.Ledger().Requests, "the gateway got nothing while paused")
	require.Less(t, still.Sent, n)
	require.Equal(t, still.Sent, readRow(t, browser, "dash").Sent, "the page shows what KV holds")
	screenshot(t, browser, "dashboard-paused")

	// Resume: the page shows it running and advancing again. Should it
	// not, say where the task's jobs wait.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		stream, err := ts.JS.Stream(context.Background(), contract.StreamJobs)
		if err != nil {
			return
		}
		info, err := stream.Info(context.Background(), jetstream.WithSubjectFilter(">"))
		if err == nil {
			t.Logf("JOBS holds %d messages, by subject: %v", info.State.Msgs, info.State.Subjects)
		}
	})
	click(t, browser, "dash", "resume")
	resumed := waitRow(t, browser, "dash", 5*time.Second, "the task resumed", func(r taskRow) bool { return r.State == "processing" })
	require.Contains(t, resumed.Reply, "resume: ok")
	waitRow(t, browser, "dash", 10*time.Second, "sending continue", func(r taskRow) bool { return r.Sent > still.Sent })
	require.Greater(t, ts.Progress(t, "dash").Sent, still.Sent)
	screenshot(t, browser, "dashboard-resumed")
}
