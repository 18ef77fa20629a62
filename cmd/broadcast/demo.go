package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/feedback"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// The demo's accounts inject faults: 5% retryable 503s, 3% 429s, and
// permanent rejects for +1555 numbers.
// Adaptive pacing learns that the random 429s are noise (unrelated to the
// pace) after a few cuts; min_rate_per_sec bounds how far those go.
const demoAccount = `{"channel":"sandbox","rate_per_sec":%d,"min_rate_per_sec":%d,"burst":20,"concurrency":16,
 "latency":"5ms","fail_rate":0.05,"rate_limited_rate":0.03,"retry_after":"300ms","permanent_prefix":"+1555"}`

// demoMaxAttempts is the demo task's max_attempts. Every attempt is
// answered 503 or 429 with a chance of 8 %, so with the default of 5 one
// recipient of 1,975 gives up on that chance in about one demo of 150,
// which the demo's check would report as a mismatch; with 10 it is about
// one in 50 million.
const demoMaxAttempts = 10

// demoTask builds the demo broadcast: n distinct recipients, every 100th a
// number the provider rejects, a few lacking the name variable, and a few
// listed twice.
func demoTask(id string, n int) (task contract.Task, wantFailed, wantSkipped, dups int) {
	task = contract.Task{
		ID: id, Channel: "sandbox", Accounts: []string{"demo-a", "demo-b"},
		Template:    "Hi {{.name}}, your code is {{.code}}",
		Defaults:    map[string]any{"code": "X-1"},
		MaxAttempts: demoMaxAttempts,
	}
	for i := range n {
		r := contract.Recipient{To: fmt.Sprintf("+86138%08d", i), Vars: map[string]any{"name": fmt.Sprintf("user%d", i)}}
		switch {
		case i%100 == 99:
			r.To = fmt.Sprintf("+1555%07d", i)
			wantFailed++
		case i%400 == 7:
			r.Vars = nil // no name: skipped, never "Hi <no value>"
			wantSkipped++
		}
		task.Recipients = append(task.Recipients, r)
	}
	for i := 0; i < 10; i++ {
		task.Recipients = append(task.Recipients, task.Recipients[i*13])
		dups++
	}
	return task, wantFailed, wantSkipped, dups
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	n := fs.Int("n", 2000, "distinct recipients")
	ratePerSec := fs.Int("rate", 150, "rate_per_sec of each of the two sandbox accounts")
	_ = fs.Parse(args)
	log, err := newLogger()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "broadcast-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, nc, js, err := startEmbedded(ctx, embedded.Config{StoreDir: dir}, log)
	if err != nil {
		return err
	}
	defer s.Shutdown()
	defer nc.Close()

	for _, name := range []string{"demo-a", "demo-b"} {
		if _, err := putAccountIfMissing(ctx, js, name, fmt.Sprintf(demoAccount, *ratePerSec, *ratePerSec/2)); err != nil {
			return err
		}
	}
	// Services log warnings only, so the progress line stays readable.
	quiet, err := shared.NewLogger(os.Stderr, shared.LogConfig{Format: os.Getenv("LOG_FORMAT"), Level: "error"})
	if err != nil {
		return err
	}
	svcCtx, stopServices := context.WithCancel(ctx)
	svcDone := make(chan error, 1)
	go func() {
		svcDone <- runServices(svcCtx, js, quiet, allServices, serviceOverrides{
			dispatch: func(c *dispatch.Config) { c.BackoffBase, c.BackoffMax = 100*time.Millisecond, 2*time.Second },
			// The demo prints its progress; a dashboard only when asked for,
			// so a running dev stack's port does not stop the demo.
			status: func(c *status.Config) {
				if getenv("DASHBOARD_ADDR") == "" {
					c.DashboardAddr = ""
				}
			},
			// Likewise feedback's routes: on a free port unless asked for.
			feedback: func(c *feedback.Config) {
				if getenv("FEEDBACK_ADDR") == "" {
					c.Addr = "127.0.0.1:0"
				}
			},
		})
	}()
	defer func() { stopServices(); <-svcDone }()

	id := "demo-" + time.Now().UTC().Format("20060102-150405")
	task, wantFailed, wantSkipped, dups := demoTask(id, *n)
	data, _ := json.Marshal(task)
	fmt.Fprintf(os.Stderr, "demo: embedded nats-server at %s, accounts demo-a and demo-b (sandbox, %d/s each, 5%% 503s, 3%% 429s)\n", s.ClientURL(), *ratePerSec)
	fmt.Fprintf(os.Stderr, "demo: sending task %s to %d recipients (%d listed twice, %d rejected by the provider, %d lacking a variable)\n",
		id, *n, dups, wantFailed, wantSkipped)
	if _, err := client.Submit(ctx, js, data); err != nil {
		return err
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	bar := newProgressBar(id)
	p, err := client.Follow(fctx, js, id, bar.update)
	bar.finish()
	if err != nil {
		return fmt.Errorf("demo: task did not finish: %w", err)
	}
	out, _ := json.MarshalIndent(p, "", "  ")
	fmt.Println(string(out))

	problems := checkDemo(p, *n, wantFailed, wantSkipped, dups)
	for _, msg := range problems {
		fmt.Fprintln(os.Stderr, "demo: MISMATCH:", msg)
	}
	if len(problems) > 0 {
		return exitCode(1)
	}
	fmt.Fprintf(os.Stderr, "demo: OK: %s, %d sent, %d failed (provider rejects), %d skipped, %d duplicates dropped, counts add up to %d\n",
		p.State, p.Sent, p.Failed, p.Skipped, p.Duplicates, p.Total)
	return nil
}

// checkDemo compares the final progress with what the demo task must give.
func checkDemo(p *contract.Progress, n, wantFailed, wantSkipped, dups int) []string {
	var out []string
	check := func(name string, got, want int) {
		if got != want {
			out = append(out, fmt.Sprintf("%s = %d, want %d", name, got, want))
		}
	}
	if !p.State.Final() {
		out = append(out, fmt.Sprintf("state %s is not final", p.State))
	}
	check("total", p.Total, n)
	check("duplicates", p.Duplicates, dups)
	check("skipped", p.Skipped, wantSkipped)
	check("failed", p.Failed, wantFailed)
	check("sent+failed+skipped+expired+cancelled", p.Done(), p.Total)
	check("sent", p.Sent, n-wantFailed-wantSkipped)
	return out
}
