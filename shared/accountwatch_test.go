package shared_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// TestAccountWatcherCatchUp: the view follows the bucket moments behind,
// so an account read right after its put may be missing (counted, for the
// record); after CatchUp every account put before it is there. Ingest
// judges a task it would reject again after CatchUp (TestChaosKillStatus
// had its task rejected for an account put just before it).
func TestAccountWatcherCatchUp(t *testing.T) {
	ts := topologytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	aw, err := shared.WatchAccounts(ctx, ts.JS, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	kv, err := ts.JS.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	const n = 200
	missedBefore := 0
	for i := range n {
		name := fmt.Sprintf("acct-%d", i)
		_, err := kv.Put(ctx, name, []byte(`{"channel":"sandbox","rate_per_sec":10}`))
		require.NoError(t, err)
		if aw.Get(name) == nil {
			missedBefore++
		}
		require.NoError(t, aw.CatchUp(ctx, 2*time.Second))
		require.NotNil(t, aw.Get(name), "%s is in the view after CatchUp", name)
	}
	t.Logf("%d of %d accounts were not yet in the view right after their put; all were after CatchUp", missedBefore, n)
}
