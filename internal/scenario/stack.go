package scenario

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// ErrNoKill is returned by a Stack that cannot kill processes (the
// in-process one).
var ErrNoKill = errors.New("scenario: this stack runs in one process; kills need the multi-process mode")

// Stack is a running Broadcast: a NATS server with the topology and the
// four services. The runner talks to it only through NATS, so an in-process
// stack and one of OS processes (package internal/proctest, from the e2e
// tests) are interchangeable.
type Stack interface {
	// URL is the NATS server's client URL.
	URL() string
	// Kill kills a process ("ingest", "render", "dispatch", "status",
	// "nats", or a further replica such as "dispatch-2": Kill.Target)
	// with SIGKILL and starts it again.
	Kill(process string) error
	// Close stops everything.
	Close()
}

// StartFunc starts a stack whose services read the given environment
// (secrets and dispatch tuning) on top of their own.
type StartFunc func(ctx context.Context, env map[string]string) (Stack, error)

// ReplicasEnv, in a StartFunc's environment, is the stack's own setting:
// how many processes of each service the multi-process stack runs
// (Scenario.Replicas). The in-process stack runs one of each.
const ReplicasEnv = "SCENARIO_REPLICAS"

// DispatchEnv is the dispatch tuning every scenario runs with: quick
// retries and short waits, so a scenario takes seconds.
var DispatchEnv = map[string]string{
	"DISPATCH_BACKOFF_BASE": "50ms",
	"DISPATCH_BACKOFF_MAX":  "500ms",
}

// inProcess is the four services and an embedded server in this process.
type inProcess struct {
	srv    *server.Server
	dir    string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*nats.Conn
}

// StartInProcess runs an embedded nats-server (store in a temporary
// directory) and the four services in this process, each on its own
// connection, as pipelinetest.StartPipeline does for tests.
func StartInProcess(ctx context.Context, env map[string]string) (Stack, error) {
	dir, err := os.MkdirTemp("", "broadcast-scenario-")
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &inProcess{srv: srv, dir: dir}
	fail := func(err error) (Stack, error) {
		s.Close()
		return nil, err
	}
	js, err := s.connect("setup")
	if err != nil {
		return fail(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := shared.EnsureTopology(tctx, js, shared.TopologyConfig{}); err != nil {
		return fail(fmt.Errorf("topology: %w", err))
	}
	log := slog.New(slog.DiscardHandler)
	if lvl := os.Getenv("SCENARIO_LOG_LEVEL"); lvl != "" {
		var l slog.Level
		_ = l.UnmarshalText([]byte(lvl))
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
	getenv := func(name string) string {
		if v, ok := env[name]; ok {
			return v
		}
		return os.Getenv(name)
	}
	sessionIdle, _ := time.ParseDuration(getenv("DISPATCH_SESSION_IDLE")) // 0 without: dispatch's default
	keptConsumers, _ := strconv.Atoi(getenv("DISPATCH_KEPT_CONSUMERS"))
	dcfg := dispatch.Config{
		BackoffBase:   50 * time.Millisecond,
		BackoffMax:    500 * time.Millisecond,
		NoHealthyWait: 2 * time.Second,
		SessionIdle:   sessionIdle,
		KeptConsumers: keptConsumers,
		Getenv:        getenv,
		Logger:        log,
	}
	var runners []interface{ Run(context.Context) error }
	for _, name := range []string{"ingest", "render", "dispatch", "status"} {
		js, err := s.connect(name)
		if err != nil {
			return fail(err)
		}
		var r interface{ Run(context.Context) error }
		switch name {
		case "ingest":
			r, err = ingest.New(js, ingest.Config{Logger: log})
		case "render":
			jobsPerMessage, _ := strconv.Atoi(getenv("RENDER_JOBS_PER_MESSAGE")) // 0 without: render's default
			r, err = render.New(js, render.Config{Logger: log, NoAccountRetry: time.Second, JobsPerMessage: jobsPerMessage})
		case "dispatch":
			r, err = dispatch.New(js, dcfg)
		case "status":
			partitions, _ := strconv.Atoi(getenv("STATUS_PARTITIONS")) // 0 without: one
			r, err = status.New(js, status.Config{Logger: log, Partitions: partitions})
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", name, err))
		}
		runners = append(runners, r)
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = rcancel
	for _, r := range runners {
		s.wg.Go(func() { _ = r.Run(rctx) })
	}
	return s, nil
}

func (s *inProcess) connect(name string) (jetstream.JetStream, error) {
	nc, err := nats.Connect(s.srv.ClientURL(), nats.Name("scenario-"+name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, nc)
	return jetstream.New(nc)
}

func (s *inProcess) URL() string { return s.srv.ClientURL() }

func (s *inProcess) Kill(string) error { return ErrNoKill }

func (s *inProcess) Close() {
	if s.cancel != nil {
		s.cancel()
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
		}
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	os.RemoveAll(s.dir)
}
