package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/proctest"
)

// TestNATSServerRestart runs nats-server (from nats.conf, so with its users),
// `broadcast setup` as admin and the five services as OS processes under
// their users, which may not create or change streams (a service that
// tried would leave a permission violation in the server's log), and
// restarts the server twice in
// the middle of a 3,000-recipient webhook broadcast on the same port and
// store: once gracefully (SIGTERM) and once with SIGKILL. The services must
// reconnect on their own and finish with nothing lost: every good recipient
// accepted by the gateway, progress equal to the gateway's ledger, and a
// recipient accepted twice only for sends in flight at a restart.
func TestNATSServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs binaries")
	}
	t.Parallel()
	const (
		n           = 3000
		concurrency = 8
	)
	svc, op := devCredentials(t)
	ns := proctest.StartNATS(t, t.TempDir(), 0, "-c", procNATSConf(t))
	setup, err := proctest.RunSetup(t, "NATS_URL="+ns.URL, "NATS_USER="+svc["setup"].User, "NATS_PASSWORD="+svc["setup"].Password)
	require.NoError(t, err, "broadcast setup:\n%s", setup)
	require.Contains(t, setup, fmt.Sprintf("topology in place: %d created, 0 updated, 0 unchanged", topologyParts()), "broadcast setup's output:\n%s", setup)
	var procs []*proctest.Proc
	for _, name := range serviceNames {
		env := []string{"NATS_URL=" + ns.URL, "NATS_USER=" + svc[name].User, "NATS_PASSWORD=" + svc[name].Password,
			"DISPATCH_BACKOFF_BASE=100ms", "DISPATCH_BACKOFF_MAX=1s", "FEEDBACK_ADDR=127.0.0.1:0", "LOG_FORMAT=json"}
		procs = append(procs, proctest.StartService(t, name, env...))
	}
	for _, p := range procs {
		p.WaitLog(p.Name+" started", 60*time.Second)
	}

	nc, err := nats.Connect(ns.URL, nats.UserInfo(op.User, op.Password), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	gw := harness.StartGateway(t, gateway.Config{FailRate: 0.03, RetryAfter: time.Second, Latency: 5 * time.Millisecond, Seed: 17})
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "hook", fmt.Appendf(nil, `{"channel":"webhook","endpoint":%q,"rate_per_sec":300,"burst":10,"concurrency":%d}`, gw.URL, concurrency))
	require.NoError(t, err)
	procs[2].WaitLog("account started", 30*time.Second)

	task := contract.Task{ID: "restart-1", Channel: "webhook", Template: "Hello {{.to}}", MaxAttempts: 20, Recipients: pipelinetest.Recipients("user", n)}
	data, err := json.Marshal(task)
	require.NoError(t, err)
	start := time.Now()
	_, err = client.Submit(ctx, js, data)
	require.NoError(t, err)

	progress := func() *contract.Progress {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		p, err := client.Get(cctx, js, task.ID)
		if err != nil {
			return &contract.Progress{}
		}
		return p
	}
	restart := func(how string, at int) {
		t.Helper()
		natstest.Eventually(t, 2*time.Minute, func() bool { return gw.Ledger().AcceptedKeys() >= at }, "%d accepted before the %s restart", at, how)
		before := gw.Ledger()
		down := time.Now()
		if how == "SIGKILL" {
			ns.Kill()
		}
		ns.Restart() // SIGTERM first when still running
		up := time.Since(down)
		natstest.Eventually(t, time.Minute, func() bool { return gw.Ledger().Requests > before.Requests+20 }, "sends resume after the %s restart", how)
		t.Logf("%s restart at %s: server down %s, sends resumed %s after the restart began; gateway had accepted %d",
			how, down.Sub(start).Round(time.Millisecond), up.Round(time.Millisecond), time.Since(down).Round(time.Millisecond), before.AcceptedKeys())
	}
	restart("SIGTERM", n/4)
	restart("SIGKILL", n/2)

	var p *contract.Progress
	last := time.Now()
	natstest.Eventually(t, 3*time.Minute, func() bool {
		p = progress()
		if time.Since(last) > time.Second {
			last = time.Now()
			t.Logf("%s sent=%d retrying=%d gateway=%d", time.Since(start).Round(time.Second), p.Sent, p.Retrying, gw.Ledger().AcceptedKeys())
		}
		return p.State.Final()
	}, "task final")
	l := gw.Ledger()
	t.Logf("restart figures: finished in %s; gateway requests=%d accepted_keys=%d duplicates=%d injected=%v; progress state=%s sent=%d failed=%d retrying=%d",
		time.Since(start).Round(time.Millisecond), l.Requests, l.AcceptedKeys(), l.Duplicates, l.Injected, p.State, p.Sent, p.Failed, p.Retrying)
	reconnects := 0
	for _, proc := range procs {
		require.True(t, proc.Running(), "%s exited: %v", proc.Name, proc.ExitErr())
		require.Equal(t, 1, proc.Starts(), "%s was not restarted", proc.Name)
		reconnects += proc.CountLog("reconnected to NATS")
	}
	t.Logf("service reconnections logged: %d", reconnects)
	require.GreaterOrEqual(t, reconnects, 2*len(procs), "every service reconnected after each restart")

	var missing []string
	for i, r := range task.Recipients {
		if l.AcceptedByKey[contract.JobID(task.ID, i, false)] == 0 {
			missing = append(missing, r.To)
		}
	}
	require.Empty(t, missing, "recipients lost")
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Total)
	require.Equal(t, l.AcceptedKeys(), p.Sent, "progress.sent vs the gateway's ledger")
	require.Zero(t, p.Retrying)
	require.LessOrEqual(t, l.Duplicates, 2*concurrency, "duplicates beyond the sends in flight at the restarts")
	require.NotContains(t, ns.Logs(), "Violation", "permission violations")
}

// procNATSConf writes a copy of nats.conf without its store_dir, beside a
// copy of the auth.conf it includes, for proctest.StartNATS, which sets the
// store (and ports) on the command line: the server runs with the
// repository's users and permissions.
func procNATSConf(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(natsConfPath)
	require.NoError(t, err)
	conf := storeDirLine.ReplaceAllString(string(data), "")
	require.NotEqual(t, string(data), conf, "nats.conf has a store_dir line")
	dir := t.TempDir()
	auth, err := os.ReadFile(filepath.Join(filepath.Dir(natsConfPath), "auth.conf"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "auth.conf"), auth, 0o644))
	path := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
	return path
}

var storeDirLine = regexp.MustCompile(`(?m)^\s*store_dir:.*$`)
