package pipelinetest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
)

// PipelineConfig tunes the services a test runs.
type PipelineConfig struct {
	Ingest   ingest.Config
	Render   render.Config
	Dispatch dispatch.Config
	Status   status.Config
	// Users, when set, connects each service ("ingest", "render",
	// "dispatch", "status") as its own user, as the Procfile does against
	// nats.conf. Defaults to the credentials of the Server.
	Users map[string]natstest.Credentials
	// Logger receives every service's log lines. Defaults to logtest.Logger().
	Logger *slog.Logger
}

// Pipeline is the four services running in this process against ts.
type Pipeline struct {
	Ingest   *ingest.Service
	Render   *render.Service
	Dispatch *dispatch.Service
	Status   *status.Service
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// StartPipeline runs ingest, render, dispatch and status, each on its own
// connection as in production, until the test ends.
func StartPipeline(t testing.TB, ts *Server, c PipelineConfig) *Pipeline {
	t.Helper()
	log := c.Logger
	if log == nil {
		log = logtest.Logger()
	}
	c.Ingest.Logger, c.Render.Logger, c.Dispatch.Logger, c.Status.Logger = log, log, log, log
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pipeline{cancel: cancel}
	var err error
	p.Ingest, err = ingest.New(ts.serviceJS(t, c.Users, "ingest"), c.Ingest)
	require.NoError(t, err)
	p.Render, err = render.New(ts.serviceJS(t, c.Users, "render"), c.Render)
	require.NoError(t, err)
	p.Dispatch, err = dispatch.New(ts.serviceJS(t, c.Users, "dispatch"), c.Dispatch)
	require.NoError(t, err)
	p.Status, err = status.New(ts.serviceJS(t, c.Users, "status"), c.Status)
	require.NoError(t, err)
	for _, r := range []interface{ Run(context.Context) error }{p.Ingest, p.Render, p.Dispatch, p.Status} {
		p.wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Errorf("service stopped: %v", err)
			}
		})
	}
	t.Cleanup(p.Stop)
	return p
}

// Stop stops every service and waits for them; calling it twice is safe.
func (p *Pipeline) Stop() {
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
}

// serviceJS connects service as its user in users, or with the Server's
// credentials when it has none there.
func (ts *Server) serviceJS(t testing.TB, users map[string]natstest.Credentials, service string) jetstream.JetStream {
	t.Helper()
	creds, ok := users[service]
	if !ok {
		creds = ts.Creds
	}
	_, js := ts.ConnectAs(t, creds)
	return js
}
