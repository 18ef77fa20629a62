package suppress_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// TestSharedLoadsOneViewForEveryCaller has two services of a process ask
// at once: both get the same view, which follows live changes; a nil
// Shared gives each caller a view of its own.
func TestSharedLoadsOneViewForEveryCaller(t *testing.T) {
	t.Parallel()
	ts, l := setup(t)
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	_, err := l.Put(ctx, "smtp", contract.Suppression{To: "a@x.org", Reason: "manual"})
	require.NoError(t, err)

	shared := new(suppress.Shared)
	views := make([]*suppress.View, 2)
	var wg sync.WaitGroup
	for i := range views {
		wg.Go(func() {
			v, err := shared.View(ctx, ts.JS, log)
			require.NoError(t, err)
			views[i] = v
		})
	}
	wg.Wait()
	require.Same(t, views[0], views[1], "one view for both")
	_, ok := views[0].Lookup("smtp", "a@x.org", contract.CategoryMarketing)
	require.True(t, ok, "loaded before it is handed out")

	_, err = l.Put(ctx, "smtp", contract.Suppression{To: "b@x.org", Reason: "manual"})
	require.NoError(t, err)
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, ok := views[1].Lookup("smtp", "b@x.org", contract.CategoryMarketing)
		return ok
	}, "the shared view follows live changes")

	var none *suppress.Shared
	a, err := none.View(ctx, ts.JS, log)
	require.NoError(t, err)
	b, err := none.View(ctx, ts.JS, log)
	require.NoError(t, err)
	require.NotSame(t, a, b, "without a Shared each caller loads its own")
}
