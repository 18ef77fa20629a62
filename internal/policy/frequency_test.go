package policy_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

func startServer(t *testing.T) *natstest.Server {
	return topologytest.Start(t)
}

func caps(t *testing.T, value string) []contract.FrequencyCap {
	p, err := contract.DecodePolicy([]byte(value))
	require.NoError(t, err)
	return p.FrequencyCaps
}

// TestReserveExactUnderContention: 40 jobs to one recipient reserved at
// once from four connections (four replicas) against a cap of 3: exactly 3
// are admitted, the other 37 are told the cap, and the record holds the 3.
func TestReserveExactUnderContention(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := context.Background()
	cs := caps(t, `{"frequency_caps":[{"max":3,"window":"24h"}]}`)
	now := time.Now()
	var counters []*policy.Counter
	for range 4 {
		_, js := ts.ConnectAs(t, ts.Creds)
		c, err := policy.OpenCounter(ctx, js)
		require.NoError(t, err)
		counters = append(counters, c)
	}
	var mu sync.Mutex
	admitted, refused := 0, 0
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			over, err := counters[i%4].Reserve(ctx, "webhook", "u1", fmt.Sprintf("job-%d", i), contract.CategoryMarketing, cs, now)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			if over == nil {
				admitted++
			} else {
				refused++
				require.Equal(t, 3, over.Count)
			}
		})
	}
	wg.Wait()
	require.Equal(t, [2]int{3, 37}, [2]int{admitted, refused})
	sends, err := counters[0].Sends(ctx, "webhook", "u1")
	require.NoError(t, err)
	require.Len(t, sends, 3)
}

// TestReserveRules: a job reserving again (a redelivery) does not count
// twice; a release frees its place; a marketing cap does not count utility
// sends while a cap without category counts both; transactional-only caps
// cannot exist, and old sends fall out of the window; the key holds the
// recipient's hash, never the recipient.
func TestReserveRules(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := context.Background()
	c, err := policy.OpenCounter(ctx, ts.JS)
	require.NoError(t, err)
	cs := caps(t, `{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"},{"max":3,"window":"168h"}]}`)
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	reserve := func(job string, cat contract.Category, at time.Time) string {
		over, err := c.Reserve(ctx, "whatsapp", "+8613800000001", job, cat, cs, at)
		require.NoError(t, err)
		if over == nil {
			return "ok"
		}
		return over.Explain()
	}
	require.Equal(t, "ok", reserve("m1", contract.CategoryMarketing, now))
	require.Equal(t, "ok", reserve("m1", contract.CategoryMarketing, now), "the same job again")
	require.Equal(t, "ok", reserve("m2", contract.CategoryMarketing, now))
	require.Equal(t, "frequency cap reached (marketing: 2 per 24h0m0s): 2 sent in the window", reserve("m3", contract.CategoryMarketing, now))
	require.Equal(t, "ok", reserve("u1", contract.CategoryUtility, now), "utility is not under the marketing cap")
	require.Equal(t, "frequency cap reached (all but transactional: 3 per 168h0m0s): 3 sent in the window", reserve("u2", contract.CategoryUtility, now))
	require.NoError(t, c.Release(ctx, "whatsapp", "+8613800000001", "m2"))
	require.Equal(t, "ok", reserve("m3", contract.CategoryMarketing, now), "m2's release freed a place")
	// A day later the marketing cap has room, the weekly one not.
	require.Equal(t, "frequency cap reached (all but transactional: 3 per 168h0m0s): 3 sent in the window",
		reserve("m4", contract.CategoryMarketing, now.Add(25*time.Hour)))
	require.Equal(t, "ok", reserve("m4", contract.CategoryMarketing, now.Add(169*time.Hour)), "a week later")
	sends, err := c.Sends(ctx, "whatsapp", "+8613800000001")
	require.NoError(t, err)
	require.Len(t, sends, 1, "the old sends were pruned")

	kv, err := ts.JS.KeyValue(ctx, contract.BucketFrequency)
	require.NoError(t, err)
	keys, err := kv.ListKeys(ctx)
	require.NoError(t, err)
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	require.Equal(t, []string{"whatsapp." + contract.RecipientHash("+8613800000001")}, all)
}

// TestReserveMessageOfSeveralCategories: a digest carrying marketing and
// utility items is one send that counts under the marketing cap, the
// utility cap and the cap without category, recorded under marketing
// with utility as Also; reserving it again counts nothing more. A check
// without reserving (Usage) does not count the message's own reservation.
// A job that reserved alone as utility and then carries marketing too has
// its reservation widened, still one send.
func TestReserveMessageOfSeveralCategories(t *testing.T) {
	t.Parallel()
	ts := startServer(t)
	ctx := context.Background()
	c, err := policy.OpenCounter(ctx, ts.JS)
	require.NoError(t, err)
	cs := caps(t, `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"},{"category":"utility","max":1,"window":"24h"},{"max":3,"window":"24h"}]}`)
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	both := []contract.Category{contract.CategoryUtility, contract.CategoryMarketing}
	explain := func(over *policy.Over, err error) string {
		require.NoError(t, err)
		if over == nil {
			return "ok"
		}
		return over.Explain()
	}
	const to = "+8613800000001"
	require.Equal(t, "ok", explain(c.ReserveMessage(ctx, "webhook", to, "digest-1", both, cs, now)))
	require.Equal(t, "ok", explain(c.ReserveMessage(ctx, "webhook", to, "digest-1", both, cs, now)), "again: reused")
	sends, err := c.Sends(ctx, "webhook", to)
	require.NoError(t, err)
	require.Len(t, sends, 1, "one send")
	require.Equal(t, contract.CategoryMarketing, sends[0].Category, "the strictest")
	require.Equal(t, []contract.Category{contract.CategoryUtility}, sends[0].Also)
	require.Equal(t, "frequency cap reached (marketing: 1 per 24h0m0s): 1 sent in the window",
		explain(c.Reserve(ctx, "webhook", to, "m", contract.CategoryMarketing, cs, now)))
	require.Equal(t, "frequency cap reached (utility: 1 per 24h0m0s): 1 sent in the window",
		explain(c.Reserve(ctx, "webhook", to, "u", contract.CategoryUtility, cs, now)), "counted under utility too")

	u, err := c.Load(ctx, "webhook", to)
	require.NoError(t, err)
	require.True(t, u.Holds("digest-1"))
	require.False(t, u.Holds("m"))
	require.NotNil(t, u.Check(contract.CategoryMarketing, cs, now))
	require.Nil(t, u.Check(contract.CategoryMarketing, cs, now, "digest-1"), "the message's own reservation does not count")
	require.Nil(t, u.Check(contract.CategoryMarketing, cs, now.Add(25*time.Hour)), "out of the window")

	const other = "+8613800000002"
	require.Equal(t, "ok", explain(c.Reserve(ctx, "webhook", other, "x", contract.CategoryUtility, cs, now)))
	require.Equal(t, "ok", explain(c.ReserveMessage(ctx, "webhook", other, "x", both, cs, now.Add(time.Hour))))
	sends, err = c.Sends(ctx, "webhook", other)
	require.NoError(t, err)
	require.Len(t, sends, 1, "widened, not added")
	require.Equal(t, contract.CategoryMarketing, sends[0].Category)
	require.Equal(t, []contract.Category{contract.CategoryUtility}, sends[0].Also)
	require.Equal(t, now.Add(time.Hour).Unix(), sends[0].At, "dated when widened")
	require.Equal(t, "frequency cap reached (marketing: 1 per 24h0m0s): 1 sent in the window",
		explain(c.Reserve(ctx, "webhook", other, "m", contract.CategoryMarketing, cs, now.Add(time.Hour))))
}

// BenchmarkReserve: one reservation under two caps, for a recipient
// without a record (one compare-and-set create) and for one with a record
// (a get and an update), from 64 goroutines as dispatch's handlers make
// them, against an embedded server in this process.
func BenchmarkReserve(b *testing.B) {
	ts := topologytest.Start(b)
	ctx := context.Background()
	c, err := policy.OpenCounter(ctx, ts.JS)
	require.NoError(b, err)
	p, err := contract.DecodePolicy([]byte(`{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"},{"max":6,"window":"168h"}]}`))
	require.NoError(b, err)
	now := time.Now()
	for _, existing := range []bool{false, true} {
		name := map[bool]string{false: "new", true: "existing"}[existing]
		b.Run(name, func(b *testing.B) {
			var seq atomic.Int64
			b.SetParallelism(32) // 64 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					to := fmt.Sprintf("%s-%d", name, i)
					if existing {
						to = fmt.Sprintf("existing-%d", i%1000)
					}
					if _, err := c.Reserve(ctx, "bench", to, fmt.Sprintf("job-%d", i), contract.CategoryMarketing, p.FrequencyCaps, now); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
