package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// TestChurnMemoryIsFlat simulates months of churn in a minute, with the
// retentions scaled down (history kept 3 s, status forgets finished tasks after 2 s,
// deleted accounts are reaped every 300 ms): waves of tasks created and
// finished, an account added and the previous one deleted each wave. It
// prints the heap after each wave and asserts it stays flat and that
// nothing piles up in KV. Opt-in: BROADCAST_SOAK=1 (about two minutes);
// BROADCAST_SOAK_HEAP=FILE writes heap profiles (FILE.mid and FILE).
func TestChurnMemoryIsFlat(t *testing.T) {
	if os.Getenv("BROADCAST_SOAK") == "" {
		t.Skip("soak test: set BROADCAST_SOAK=1 to run it")
	}
	const waves, perWave, recipientsEach = 24, 250, 4
	// The server's history (TASKS, EVENTS, DEAD, task records) is kept 3 s
	// here, as it is kept 30 days in production: a month of it is what a
	// real server holds.
	ts := pipelinetest.StartWithTopology(t, shared.TopologyConfig{Retention: 3 * time.Second})
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{
		Dispatch: dispatch.Config{ReapInterval: 300 * time.Millisecond},
		Status:   status.Config{Retention: 2 * time.Second},
	})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	progressKeys := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
		require.NoError(t, err)
		keys, err := kv.ListKeys(ctx)
		require.NoError(t, err)
		n := 0
		for range keys.Keys() {
			n++
		}
		return n
	}
	var heaps []uint64
	for w := range waves {
		acct := fmt.Sprintf("churn-%d", w)
		ts.PutAccount(t, acct, `{"channel":"sandbox","rate_per_sec":5000,"burst":100,"concurrency":64}`)
		if w > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			kv, err := ts.JS.KeyValue(ctx, contract.BucketAccounts)
			require.NoError(t, err)
			require.NoError(t, kv.Delete(ctx, fmt.Sprintf("churn-%d", w-1)))
			cancel()
		}
		ids := make([]string, perWave)
		for i := range perWave {
			ids[i] = fmt.Sprintf("w%02d-%03d", w, i)
			submit(t, ts, contract.Task{ID: ids[i], Channel: "sandbox", Accounts: []string{acct}, Template: "hi {{.to}}", Recipients: recipients(ids[i]+"-", recipientsEach)})
		}
		for _, id := range ids {
			ts.WaitFinal(t, id, 60*time.Second)
		}
		time.Sleep(3500 * time.Millisecond) // past the retention: the wave is forgotten
		heaps = append(heaps, heap())
		if path := os.Getenv("BROADCAST_SOAK_HEAP"); path != "" && w == waves/3 {
			f, err := os.Create(path + ".mid")
			require.NoError(t, err)
			require.NoError(t, pprof.WriteHeapProfile(f))
			require.NoError(t, f.Close())
		}
		t.Logf("wave %2d: %d tasks done; heap %.1f MB; progress keys %d", w, (w+1)*perWave, float64(heaps[w])/(1<<20), progressKeys())
	}
	// The first waves warm caches and pools; compare the last third with
	// the second.
	if path := os.Getenv("BROADCAST_SOAK_HEAP"); path != "" {
		f, err := os.Create(path)
		require.NoError(t, err)
		runtime.GC()
		require.NoError(t, pprof.WriteHeapProfile(f))
		require.NoError(t, f.Close())
	}
	mid, last := heaps[waves/2], heaps[waves-1]
	t.Logf("%d tasks over %d waves: heap %.1f MB after wave %d, %.1f MB after the last (x%.2f)",
		waves*perWave, waves, float64(mid)/(1<<20), 2*waves/3, float64(last)/(1<<20), float64(last)/float64(mid))
	require.Less(t, float64(last), 1.2*float64(mid), "memory stays flat under churn")
	require.Less(t, progressKeys(), perWave, "finished tasks are forgotten")
}
