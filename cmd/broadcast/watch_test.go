package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestFollowReceiptsSeesLateCounts: watch -receipts keeps reading a final
// task's progress and returns the receipt counts written after it ended.
func TestFollowReceiptsSeesLateCounts(t *testing.T) {
	ts := pipelinetest.Start(t)
	ctx := context.Background()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
	require.NoError(t, err)
	p := &contract.Progress{TaskID: "w-1", State: contract.StateSucceeded, Total: 3, Sent: 3}
	put := func(p *contract.Progress) {
		data, err := json.Marshal(p)
		require.NoError(t, err)
		_, err = kv.Put(ctx, p.TaskID, data)
		require.NoError(t, err)
	}
	put(p)
	go func() {
		time.Sleep(1200 * time.Millisecond)
		late := *p
		late.Delivered, late.Read, late.Undelivered = 2, 1, 1
		put(&late)
	}()
	got := followReceipts(ctx, ts.JS, p, 3*time.Second)
	require.Equal(t, [3]int{2, 1, 1}, [3]int{got.Delivered, got.Read, got.Undelivered})
	require.Equal(t, contract.StateSucceeded, got.State)
}
