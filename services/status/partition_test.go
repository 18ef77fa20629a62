package status

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestPartitionNames: one partition keeps the names status always had
// (consumer "status", lease status.fold), so a single-partition upgrade
// changes nothing; more get names of their own, with the count in them.
func TestPartitionNames(t *testing.T) {
	one := newPartitions(1)
	require.Len(t, one, 1)
	require.Equal(t, contract.ConsumerStatus, one[0].consumer)
	require.Equal(t, contract.StatusFoldLease, one[0].leaseKey)
	four := newPartitions(4)
	seen := map[string]bool{}
	for k, p := range four {
		require.Equal(t, fmt.Sprintf("status-%d-of-4", k), p.consumer)
		require.Equal(t, fmt.Sprintf("status.fold.%d-of-4", k), p.leaseKey)
		require.Equal(t, FoldLeaseKey(k, 4), p.leaseKey)
		require.False(t, seen[p.leaseKey])
		seen[p.leaseKey] = true
	}
}

// TestPartitionOfSpreadsTasksAndOwnsEachOnce: every task belongs to
// exactly one partition, ids spread evenly, and the hash does not change
// (a running fold would split a task between two partitions).
func TestPartitionOfSpreadsTasksAndOwnsEachOnce(t *testing.T) {
	const n, tasks = 4, 4000
	parts := newPartitions(n)
	count := make([]int, n)
	for i := range tasks {
		id := fmt.Sprintf("promo-2026-12-%d", i)
		owners := 0
		for _, p := range parts {
			if p.owns(id) {
				owners++
				count[p.k]++
			}
		}
		require.Equal(t, 1, owners, id)
		require.Zero(t, PartitionOf(id, 1))
	}
	for id, k := range map[string]int{"parts-0": 0, "parts-3": 1, "parts-6": 2, "parts-9": 3} {
		require.Equal(t, k, PartitionOf(id, n), id)
	}
	for k, c := range count {
		require.InDelta(t, tasks/n, c, tasks/n/5, "partition %d has %d of %d tasks", k, c, tasks)
	}
}

// TestPartitionsFromEnv: STATUS_PARTITIONS is read, bounded, and named in
// its error.
func TestPartitionsFromEnv(t *testing.T) {
	t.Setenv("DASHBOARD_ADDR", "off")
	t.Setenv("STATUS_PARTITIONS", "4")
	c, err := ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, 4, c.Partitions)
	for _, bad := range []string{"0", "17", "two"} {
		t.Setenv("STATUS_PARTITIONS", bad)
		_, err := ConfigFromEnv()
		require.ErrorContains(t, err, "STATUS_PARTITIONS")
	}
	t.Setenv("STATUS_PARTITIONS", "")
	c, err = ConfigFromEnv()
	require.NoError(t, err)
	c.withDefaults()
	require.Equal(t, 1, c.Partitions)
}
