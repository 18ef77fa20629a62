package process

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/proctest"
	"github.com/broadcastd/broadcast/shared"
)

// TestChurnMemoryIsFlat runs the four services as their own processes, as
// the Procfile does, through months of churn in about two minutes, with the
// retentions scaled down (the server keeps history 3 s where production
// keeps 30 days, status forgets finished tasks after 2 s, dispatch reaps
// deleted accounts every 300 ms): waves of tasks created and finished, an
// account added and the previous one deleted each wave. It prints each
// process's resident memory after every wave and asserts each service's
// stays flat, and that nothing piles up in KV. Opt-in, as a soak:
// BROADCAST_SOAK=1 (.ci/run runs it).
func TestChurnMemoryIsFlat(t *testing.T) {
	if os.Getenv("BROADCAST_SOAK") == "" {
		t.Skip("soak test: set BROADCAST_SOAK=1 to run it")
	}
	const waves, perWave, recipientsEach = 24, 250, 4
	ns := proctest.StartNATS(t, t.TempDir(), 0)
	nc, err := nats.Connect(ns.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, shared.EnsureTopology(ctx, js, shared.TopologyConfig{Retention: 3 * time.Second}))
	cancel()

	env := "NATS_URL=" + ns.URL
	services := []*proctest.Proc{
		proctest.StartService(t, "ingest", env),
		proctest.StartService(t, "render", env),
		proctest.StartService(t, "dispatch", env, "DISPATCH_REAP_INTERVAL=300ms"),
		proctest.StartService(t, "status", env, "STATUS_RETENTION=2s"),
	}
	for _, p := range services {
		p.WaitLog(p.Name+" started", 30*time.Second)
	}
	procs := append([]*proctest.Proc{ns}, services...)

	kv := func(bucket string) jetstream.KeyValue {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, err := js.KeyValue(ctx, bucket)
		require.NoError(t, err)
		return b
	}
	progress, accounts, records := kv(contract.BucketProgress), kv(contract.BucketAccounts), kv(contract.BucketTasks)
	keys := func(b jetstream.KeyValue) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := b.ListKeys(ctx)
		require.NoError(t, err)
		n := 0
		for range l.Keys() {
			n++
		}
		return n
	}
	// Each wave's account is added a wave ahead, so every service has
	// seen it when the wave's tasks arrive.
	putAccount := func(ctx context.Context, w int) {
		_, err := accounts.Put(ctx, fmt.Sprintf("churn-%d", w), []byte(`{"channel":"sandbox","rate_per_sec":5000,"burst":100,"concurrency":64}`))
		require.NoError(t, err)
	}
	putAccount(context.Background(), 0)
	time.Sleep(time.Second)
	rss := map[string][]float64{} // MB after each wave, by process
	start := time.Now()
	for w := range waves {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		acct := fmt.Sprintf("churn-%d", w)
		putAccount(ctx, w+1)
		if w > 0 {
			require.NoError(t, accounts.Delete(ctx, fmt.Sprintf("churn-%d", w-1)))
		}
		ids := make([]string, perWave)
		for i := range perWave {
			ids[i] = fmt.Sprintf("w%02d-%03d", w, i)
			task := contract.Task{ID: ids[i], Channel: "sandbox", Accounts: []string{acct}, Template: "hi {{.to}}",
				Recipients: pipelinetest.Recipients(ids[i]+"-", recipientsEach)}
			data, err := json.Marshal(task)
			require.NoError(t, err)
			_, err = client.Submit(ctx, js, data)
			require.NoError(t, err)
		}
		for _, id := range ids {
			for {
				p, err := client.Get(ctx, js, id)
				if err == nil && p.State.Final() {
					require.Equal(t, contract.StateSucceeded, p.State, "task %s: %+v", id, p)
					break
				}
				require.NoError(t, ctx.Err(), "task %s not final", id)
				time.Sleep(20 * time.Millisecond)
			}
		}
		cancel()
		time.Sleep(3500 * time.Millisecond) // past the retentions: the wave is forgotten
		var line []string
		for _, p := range procs {
			mb := residentMB(t, p.Pid())
			rss[p.Name] = append(rss[p.Name], mb)
			line = append(line, fmt.Sprintf("%s %.1f", p.Name, mb))
		}
		t.Logf("wave %2d (%5d tasks, %s): RSS MB %s; progress keys %d, task records %d",
			w, (w+1)*perWave, time.Since(start).Round(time.Second), strings.Join(line, ", "), keys(progress), keys(records))
	}
	for _, p := range services {
		require.True(t, p.Running(), "%s exited: %v", p.Name, p.ExitErr())
	}
	// The first waves warm caches, pools and the heap's goal: compare the
	// highest of the last third with the highest of the second third.
	third := waves / 3
	for _, p := range procs {
		mid, last := slices.Max(rss[p.Name][third:2*third]), slices.Max(rss[p.Name][2*third:])
		t.Logf("%s: RSS %.1f MB at most in waves %d-%d, %.1f MB at most in waves %d-%d (x%.2f)",
			p.Name, mid, third, 2*third-1, last, 2*third, waves-1, last/mid)
		if p == ns {
			continue // the server's memory follows what it stores, reported only
		}
		require.Less(t, last, 1.15*mid+2, "%s's memory stays flat under churn", p.Name)
	}
	require.Less(t, keys(progress), perWave, "finished tasks are forgotten")
	// A record ingest keeps alive for a task status has forgotten would
	// never age out, and the keep-alive rounds would grow with them.
	require.Less(t, keys(records), 3*perWave, "finished tasks' records age out")
	require.Equal(t, 2, keys(accounts), "the last wave's account and the next one's are left")
	require.GreaterOrEqual(t, services[2].CountLog("deleted account's runner stopped"), waves-2, "deleted accounts' runners are stopped")
}

// residentMB is the resident set size of process pid, in MB (Linux).
func residentMB(t *testing.T, pid int) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			require.NoError(t, err)
			return float64(kb) / 1024
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
