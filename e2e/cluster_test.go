package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/pki"
)

var clusterConfs = []string{"../deploy/cluster/n1.conf", "../deploy/cluster/n2.conf", "../deploy/cluster/n3.conf"}

// clusterConfigs copies deploy/cluster's node configurations (and the
// repository's auth.conf they include) into a temporary directory, with
// route certificates made by `broadcast certs`'s code there: the files
// name their certificates relative to the repository root, where the
// README runs them, and the tests run in e2e/.
func clusterConfigs(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	require.NoError(t, pki.WriteRouteCerts(tlsDir, []string{"127.0.0.1", "localhost"}, time.Hour))
	auth, err := os.ReadFile("../auth.conf")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "auth.conf"), auth, 0o644))
	var out []string
	for _, f := range clusterConfs {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		conf := string(data)
		require.Contains(t, conf, "deploy/cluster/tls/", "%s names its route certificates", f)
		require.Contains(t, conf, "include ../../auth.conf", "%s includes the repository's auth.conf", f)
		conf = strings.ReplaceAll(conf, "deploy/cluster/tls/", tlsDir+"/")
		conf = strings.ReplaceAll(conf, "include ../../auth.conf", "include ./auth.conf")
		path := filepath.Join(dir, filepath.Base(f))
		require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
		out = append(out, path)
	}
	return out
}

// TestClusterLeaderFailover runs the pipeline on a three-node JetStream
// cluster built from deploy/cluster (its users, route credentials and
// sync_interval: always) with every stream and bucket at three replicas,
// and shuts down the node leading stream JOBS in the middle of a
// 1,000-recipient webhook broadcast. The gateway's ledger is the judge:
// nobody lost, no recipient accepted twice beyond the sends in flight at
// the kill (the account's concurrency), progress equal to what the gateway
// accepted. The killed node then rejoins and catches up.
func TestClusterLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the three-node cluster test")
	}
	t.Parallel()
	svc, op := devCredentials(t)
	c := pipelinetest.StartCluster(t, natstest.ClusterOptions{ConfigFiles: clusterConfigs(t), SetupAs: svc["setup"], ClientAs: op})
	for _, name := range []string{contract.StreamTasks, contract.StreamJobs, contract.StreamEvents, "KV_" + contract.BucketLedger, "OBJ_" + contract.BucketStatus} {
		st, err := c.JS.Stream(context.Background(), name)
		require.NoError(t, err)
		require.Equal(t, 3, st.CachedInfo().Config.Replicas, "stream %s replicas", name)
	}

	const (
		n           = 1000
		bad         = 10 // every 100th recipient is rejected permanently
		concurrency = 8
	)
	gw := harness.StartGateway(t, gateway.Config{FailRate: 0.03, RetryAfter: time.Second, Latency: 5 * time.Millisecond, PermanentPrefix: "bad-", Seed: 13})
	c.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":250,"burst":10,"concurrency":%d}`, gw.URL, concurrency))
	cfg := harness.FastRetries()
	cfg.Users = svc
	// The services' warnings, shown with a summary of their goroutines if
	// the test fails: sending once stopped after a failover, with every
	// in-flight job unacknowledged, in 1 of 5 CI runs.
	logs := &logtest.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pipelinetest.StartPipeline(t, c.Server, cfg)

	task := contract.Task{ID: "cluster-1", Channel: "webhook", Template: "Hello {{.to}}", MaxAttempts: 20}
	task.Recipients, _ = pipelinetest.RecipientsWithRejects(n, 100, 50)
	start := time.Now()
	submitAsOperator(t, c.Server, task)

	// Kill the JOBS leader a third of the way through.
	natstest.Eventually(t, 60*time.Second, func() bool { return gw.Ledger().AcceptedKeys() >= n/3 }, "a third sent")
	leader := c.Nodes.StreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, contract.StreamJobs)
	require.GreaterOrEqual(t, leader, 0, "JOBS has a leader")
	atKill := gw.Ledger()
	killedAt := time.Now()
	c.Nodes.Kill(leader)
	t.Logf("killed n%d (JOBS leader) at %s: gateway accepted %d, requests %d",
		leader+1, killedAt.Sub(start).Round(time.Millisecond), atKill.AcceptedKeys(), atKill.Requests)

	t.Cleanup(func() {
		if t.Failed() {
			dumpClusterState(t, c)
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			for _, l := range lines[max(0, len(lines)-60):] {
				t.Log("service: " + l)
			}
			dumpServiceGoroutines(t)
		}
	})
	newLeader := -1
	natstest.Eventually(t, 30*time.Second, func() bool {
		newLeader = c.Nodes.StreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, contract.StreamJobs)
		return newLeader >= 0
	}, "JOBS elects a new leader")
	election := time.Since(killedAt)
	natstest.Eventually(t, 2*time.Minute, func() bool { return gw.Ledger().Requests > atKill.Requests+50 }, "sending resumes")
	resumed := time.Since(killedAt)

	p := c.WaitFinal(t, task.ID, 3*time.Minute)
	elapsed := time.Since(start)
	l := gw.Ledger()
	t.Logf("cluster figures: new JOBS leader n%d after %s; sends resumed %s after the kill; finished in %s",
		newLeader+1, election.Round(time.Millisecond), resumed.Round(time.Millisecond), elapsed.Round(time.Millisecond))
	t.Logf("gateway: requests=%d accepted_keys=%d duplicates=%d injected=%v; progress: state=%s total=%d sent=%d failed=%d retrying=%d",
		l.Requests, l.AcceptedKeys(), l.Duplicates, l.Injected, p.State, p.Total, p.Sent, p.Failed, p.Retrying)

	// Nobody lost: every good recipient accepted, under its own key and text.
	var missing []string
	for i, r := range task.Recipients {
		key := contract.JobID(task.ID, i, false)
		if r.To[:4] != "bad-" && l.AcceptedByKey[key] == 0 {
			missing = append(missing, r.To)
		}
	}
	require.Empty(t, missing, "recipients the gateway never accepted")
	require.Equal(t, n-bad, l.AcceptedKeys())
	// Progress exact, and equal to the gateway's ledger.
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, n, p.Total)
	require.Equal(t, l.AcceptedKeys(), p.Sent, "progress.sent vs keys the gateway accepted")
	require.Equal(t, bad, p.Failed)
	require.Zero(t, p.Retrying)
	require.Equal(t, p.Total, p.Done())
	// Only sends in flight at the kill may be repeated.
	require.LessOrEqual(t, l.Duplicates, concurrency, "recipients accepted twice")
	require.Empty(t, c.Log.Violations(), "permission violations")

	// The killed node rejoins and catches up with JOBS and EVENTS.
	require.NoError(t, c.Nodes.Restart(leader))
	natstest.Eventually(t, 60*time.Second, func() bool {
		s := c.Nodes.Servers[leader]
		return s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, contract.StreamJobs) &&
			s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, contract.StreamEvents)
	}, "n%d catches up", leader+1)
}

// dumpClusterState logs what a failed failover test needs to be understood:
// stream and consumer leaders and the consumers' delivery state.
func dumpClusterState(t *testing.T, c *pipelinetest.Cluster) {
	for i, s := range c.Nodes.Servers {
		if s == nil {
			t.Logf("node n%d: down", i+1)
			continue
		}
		t.Logf("node n%d: meta leader %v, current %v, clients %d, routes %d", i+1, s.JetStreamIsLeader(), s.JetStreamIsCurrent(), s.NumClients(), s.NumRoutes())
	}
	t.Logf("test client connected %v to %s", c.NC.IsConnected(), c.NC.ConnectedUrl())
	lines := c.Log.Lines()
	for _, l := range lines[max(0, len(lines)-40):] {
		t.Log(l)
	}
	for _, name := range allStreams() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		st, err := c.JS.Stream(ctx, name)
		if err != nil {
			t.Logf("stream %s: %v", name, err)
			continue
		}
		info := st.CachedInfo()
		leader := ""
		if info.Cluster != nil {
			leader = info.Cluster.Leader
		}
		t.Logf("stream %s: leader %q msgs %d", name, leader, info.State.Msgs)
		for ci := range st.ListConsumers(ctx).Info() {
			cl := ""
			if ci.Cluster != nil {
				cl = ci.Cluster.Leader
			}
			t.Logf("  consumer %s: leader %q pending %d ack_pending %d redelivered %d waiting %d groups %+v",
				ci.Name, cl, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.PriorityGroups)
		}
	}
}

// dumpServiceGoroutines logs the goroutines running the project's code,
// grouped by stack (arguments and offsets dropped) with their counts, to
// show where a stuck pipeline waits.
func dumpServiceGoroutines(t *testing.T) {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	counts := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "broadcast/services/") && !strings.Contains(g, "broadcast/shared.") {
			continue
		}
		lines := strings.Split(g, "\n")
		state := lines[0]
		if i, j := strings.Index(state, "["), strings.IndexAny(state, ",]"); i >= 0 && j > i {
			state = state[i+1 : j]
		}
		frames := []string{"[" + state + "]"}
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "created by") {
				continue
			}
			if i := strings.LastIndex(l, "("); i > 0 {
				l = l[:i]
			}
			if frames = append(frames, l); len(frames) == 11 {
				break
			}
		}
		counts[strings.Join(frames, " < ")]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	for _, k := range keys {
		t.Logf("goroutines x%d: %s", counts[k], k)
	}
}

// TestClusterConfigsMatchNATSConf checks that the cluster nodes in
// deploy/cluster carry exactly the users and permissions of nats.conf, use
// sync_interval: always, and authenticate their routes and run them over
// TLS that verifies the peer.
func TestClusterConfigsMatchNATSConf(t *testing.T) {
	t.Parallel()
	single, err := server.ProcessConfigFile(natsConfPath)
	require.NoError(t, err)
	perms := func(o *server.Options) map[string]any {
		out := map[string]any{}
		for _, u := range o.Users {
			out[u.Username] = []any{u.Password, u.Permissions}
		}
		return out
	}
	for i, f := range clusterConfigs(t) {
		o, err := server.ProcessConfigFile(f)
		require.NoError(t, err, f)
		require.True(t, reflect.DeepEqual(perms(single), perms(o)), "%s: users and permissions differ from nats.conf (both should include auth.conf)", f)
		require.True(t, o.SyncAlways, "%s: jetstream { sync_interval: always }", f)
		require.Equal(t, fmt.Sprintf("n%d", i+1), o.ServerName)
		require.Equal(t, 4222+i, o.Port)
		require.Len(t, o.Routes, 3)
		require.NotEmpty(t, o.Cluster.Username, "%s: routes authenticate", f)
		require.NotNil(t, o.Cluster.TLSConfig, "%s: routes use TLS", f)
		require.Equal(t, tls.RequireAndVerifyClientCert, o.Cluster.TLSConfig.ClientAuth, "%s: routes verify the peer's certificate", f)
		require.Empty(t, o.NoAuthUser)
	}
}
