package status

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestFoldNamesCounts: which partition count a consumer name or a lease
// key belongs to, exactly; anything else (another consumer on EVENTS, a
// malformed or out-of-range name) is no fold's and never removed.
func TestFoldNamesCounts(t *testing.T) {
	for name, want := range map[string]int{
		contract.ConsumerStatus: 1, "status-0-of-4": 4, "status-3-of-4": 4, "status-15-of-16": 16, "status-1-of-2": 2,
		"status-4-of-4": 0, "status-0-of-1": 0, "status-0-of-17": 0, "status-audit": 0, "status-0-of-4x": 0,
		"status-00-of-4": 0, "statusx": 0, "status-": 0, "feedback": 0, "status--1-of-4": 0,
	} {
		require.Equal(t, want, foldConsumerCount(name), name)
	}
	for key, want := range map[string]int{
		contract.StatusFoldLease: 1, FoldLeaseKey(0, 4): 4, FoldLeaseKey(2, 3): 3, "status.fold.4-of-4": 0,
		"status.fold.x": 0, "status.folds": 0,
	} {
		require.Equal(t, want, foldLeaseCount(key), key)
	}
	for k := range 16 {
		require.Equal(t, 16, foldConsumerCount(newPartitions(16)[k].consumer))
		require.Equal(t, 16, foldLeaseCount(newPartitions(16)[k].leaseKey))
	}
}
