package scenario

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBoundCoversTheSlowestAccount: a task's bound leaves its pool's
// slowest account the time it needs for its share of the pool's
// recipients, also past MaxBound (seed 715504403: 511 recipients of two
// tasks on one account answering 429 above 3/s, its pool's other account
// disabled at the first task's submission, so render gave it nothing;
// the tasks needed about 3 minutes and were held to 2), and stays at
// MaxBound when that time is well within it.
func TestBoundCoversTheSlowestAccount(t *testing.T) {
	t.Parallel()
	off, on := false, true
	sc := &Scenario{Seed: 1,
		Pools: []Pool{{Channel: "webhook", Accounts: []Account{
			{Name: "hook-a", RatePerSec: 6, Burst: 9, Concurrency: 9, Faults: Faults{CapacityPerSec: 3}},
			{Name: "hook-b", RatePerSec: 423, Burst: 5, Concurrency: 10},
		}}},
		Tasks: []Task{
			{ID: "t0", Channel: "webhook", Recipients: make([]int, 250), Bad: make([]int, 11)},
			{ID: "t1", Channel: "webhook", Recipients: make([]int, 250), Accounts: []string{"hook-a"}, Priority: "high"},
		},
		Actions: []Action{
			{At: 984 * time.Millisecond, Kind: ActEdit, Account: "hook-b", Enabled: &off},
			{At: 1759 * time.Millisecond, Kind: ActEdit, Account: "hook-b", Enabled: &on},
		},
	}
	need := 511 * time.Second / 3
	for _, task := range sc.Tasks {
		require.Greater(t, Bound(sc, task), need+need/4, "task %s: 511 sends at 3/s take %s", task.ID, need)
	}

	// 300 recipients at 6/s: three times the estimate is past MaxBound,
	// half again it is within.
	sc.Pools[0].Accounts[0].Faults.CapacityPerSec = 0
	sc.Tasks = []Task{{ID: "t0", Channel: "webhook", Recipients: make([]int, 300), Accounts: []string{"hook-a"}}}
	require.Equal(t, MaxBound, Bound(sc, sc.Tasks[0]))

	// Pinned to an account answering 401 (seed 931512175): no account's
	// pace to go by, MaxBound.
	sc.Pools[0].Accounts[0].Faults.Unauthorized = true
	require.Equal(t, MaxBound, Bound(sc, sc.Tasks[0]))
	// And never past MaxFloorBound.
	sc.Pools[0].Accounts[0].Faults = Faults{CapacityPerSec: 0.5}
	require.Equal(t, MaxFloorBound, Bound(sc, sc.Tasks[0]))
}

// TestBoundCountsAccountsAddedLater: an account added during the run gets
// its share of what render renders after and of the work moved off
// others, so a slow one sets the bound (seed 13250440: added at 0.95 s,
// its provider taking 4/s, 41 jobs still queued on it at a bound of 57 s
// while the pool's 97/s account had none).
func TestBoundCountsAccountsAddedLater(t *testing.T) {
	t.Parallel()
	sc := &Scenario{Seed: 13250440,
		Pools: []Pool{{Channel: "webhook", Accounts: []Account{
			{Name: "hook-a", RatePerSec: 97, Burst: 7, Concurrency: 5},
			{Name: "hook-c", RatePerSec: 6, Burst: 8, Concurrency: 14, AddedLater: true, Faults: Faults{CapacityPerSec: 4}},
		}}},
		Tasks:   []Task{{ID: "t0", Channel: "webhook", Recipients: make([]int, 298)}},
		Actions: []Action{{At: 950 * time.Millisecond, Kind: ActAdd, Account: "hook-c"}},
	}
	need := 149 * time.Second / 4 // hook-c's half at 4/s
	require.Greater(t, Bound(sc, sc.Tasks[0]), 2*need, "half of 298 sends at 4/s take %s", need)

	// Added later and answering 401: no pace of its own, the bound is
	// hook-a's.
	sc.Pools[0].Accounts[1].Faults = Faults{Unauthorized: true}
	require.Less(t, Bound(sc, sc.Tasks[0]), 30*time.Second)
}
