package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/feedback"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// defaultMemoryLimit is the soft heap limit of a service process running
// name. Below a process's working set the collector runs without pause: at
// 100 MiB a dispatch sending 15,000 recipients a second through three
// accounts spent its CPU collecting, ran at half the rate and lost every
// account's lease. Dispatch holds the jobs its accounts' concurrency and
// pacing let in, so it gets 1 GiB; the others' working sets are bounded by
// their batches and stay lean under 100 MiB. In a container, set
// GOMEMLIMIT to about 90 % of its memory.
func defaultMemoryLimit(name string) int64 {
	if name == "dispatch" || name == "all" {
		return 1 << 30
	}
	return 100 << 20
}

// serviceOverrides lets dev and demo tune services beyond the environment.
type serviceOverrides struct {
	dispatch func(*dispatch.Config)
	status   func(*status.Config)
	feedback func(*feedback.Config)
	// statusReplicas is how many status services bench runs (0: one),
	// statusPartitions the partitions of their fold (0: STATUS_PARTITIONS).
	statusReplicas, statusPartitions int
	// registry is the services' metrics registry (nil: a new one), for
	// bench to read render's count.
	registry *prometheus.Registry
	// renderRegistry, when set, takes render's metrics instead, so bench
	// reads render's count without gathering every account's metrics.
	renderRegistry *prometheus.Registry
	// taskProfile, when set, receives bench's CPU profile of the task's
	// run, from its submission to its final progress.
	taskProfile io.Writer
}

func newLogger() (*slog.Logger, error) {
	return shared.NewLogger(os.Stderr, shared.LogConfigFromEnv())
}

func runServiceCommand(ctx context.Context, name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	_ = fs.Parse(args)
	log, err := newLogger()
	if err != nil {
		return err
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// A soft heap limit keeps a service lean (the GC works harder as it
		// nears it) without ever failing an allocation. GOMEMLIMIT overrides.
		debug.SetMemoryLimit(defaultMemoryLimit(name))
	}
	// The topology is `broadcast setup`'s: a service only waits for it.
	nc, js, err := shared.ConnectService(ctx, shared.NATSConfigFromEnv(), name, log)
	if err != nil {
		return err
	}
	defer nc.Drain()
	names := []string{name}
	if name == "all" {
		names = allServices
	}
	return runServices(ctx, js, log, names, serviceOverrides{})
}

// allServices are the services `broadcast all`, dev and demo run together.
var allServices = []string{"ingest", "render", "dispatch", "status", "feedback"}

// runServices runs the named services until ctx ends or one fails; a failure
// stops the others. The services share one metrics registry, served at
// METRICS_ADDR (when set) and by status on its dashboard.
func runServices(ctx context.Context, js jetstream.JetStream, log *slog.Logger, names []string, o serviceOverrides) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type runner interface{ Run(context.Context) error }
	var runners []runner
	reg := o.registry
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	statuses := 0
	// Render and dispatch check the same suppression list: one view.
	suppressions := new(suppress.Shared)
	for _, n := range names {
		var r runner
		var err error
		switch n {
		case "ingest":
			var c ingest.Config
			if c, err = ingest.ConfigFromEnv(); err == nil {
				c.Logger, c.Metrics = log, reg
				r, err = ingest.New(js, c)
			}
		case "render":
			var c render.Config
			if c, err = render.ConfigFromEnv(); err == nil {
				c.Logger, c.Metrics, c.Suppressions = log, reg, suppressions
				if o.renderRegistry != nil {
					c.Metrics = o.renderRegistry
				}
				r, err = render.New(js, c)
			}
		case "dispatch":
			var c dispatch.Config
			if c, err = dispatch.ConfigFromEnv(); err == nil {
				c.Logger, c.Metrics, c.Suppressions = log, reg, suppressions
				if o.dispatch != nil {
					o.dispatch(&c)
				}
				r, err = dispatch.New(js, c)
			}
		case "status":
			var c status.Config
			if c, err = status.ConfigFromEnv(); err == nil {
				c.Logger, c.Metrics = log, reg
				if o.status != nil {
					o.status(&c)
				}
				if o.statusPartitions > 0 {
					c.Partitions = o.statusPartitions
				}
				if statuses++; statuses > 1 {
					// Standbys of the first (bench -status-replicas): one
					// dashboard and one set of metrics per process.
					c.DashboardAddr, c.Metrics = "", nil
				}
				r, err = status.New(js, c)
			}
		case "feedback":
			var c feedback.Config
			if c, err = feedback.ConfigFromEnv(); err == nil {
				c.Logger, c.Metrics = log, reg
				if o.feedback != nil {
					o.feedback(&c)
				}
				r, err = feedback.New(js, c)
			}
		default:
			err = fmt.Errorf("unknown service %q", n)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		runners = append(runners, r)
	}
	if addr := getenv("METRICS_ADDR"); addr != "" {
		runners = append(runners, runFunc(func(ctx context.Context) error { return metrics.Serve(ctx, addr, reg, log) }))
		names = append(names[:len(names):len(names)], "metrics")
	}
	if addr := getenv("PPROF_ADDR"); addr != "" {
		runners = append(runners, runFunc(func(ctx context.Context) error { return servePprof(ctx, addr, log) }))
		names = append(names[:len(names):len(names)], "pprof")
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(runners))
	for i, r := range runners {
		wg.Go(func() {
			// An error once ctx ended is the stop's (a signal, or
			// another service's failure, reported already), not news.
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", names[i], err)
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// runFunc makes a function a service runner.
type runFunc func(context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }
