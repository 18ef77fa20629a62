package status_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// TestFinalProgressIsWrittenAtOnce: with progress written once a second,
// a task whose last outcome is folded still reads final within a fraction
// of that second, in each of three tasks (waiting for the next tick, each
// would have a chance of about one in four).
func TestFinalProgressIsWrittenAtOnce(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer runStatus(t, ts, status.Config{Logger: logtest.Logger(), FlushInterval: time.Second})()
	const total = 5
	for i := range 3 {
		task := fmt.Sprintf("final-%d", i)
		publishEvent(ctx, t, ts, task, contract.Event{Kind: contract.EventAccepted, Index: -1, Total: total, State: contract.StateProcessing})
		natstest.Eventually(t, 10*time.Second, func() bool { return ts.Progress(t, task) != nil })
		for k := range total {
			publishEvent(ctx, t, ts, task, contract.Event{JobID: fmt.Sprintf("%s.%d", task, k), Kind: contract.EventSent, Index: k, Attempt: 1})
		}
		last := time.Now()
		var took time.Duration
		natstest.Eventually(t, 5*time.Second, func() bool {
			p := ts.Progress(t, task)
			took = time.Since(last)
			return p != nil && p.State == contract.StateSucceeded && p.Sent == total
		})
		t.Logf("%s final %s after its last event was stored", task, took.Round(time.Millisecond))
		require.Less(t, took, 250*time.Millisecond, "%s: progress waited for the next tick", task)
	}
}
