package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// leasesBucket starts a JetStream server with the topology and returns the
// leases bucket.
func leasesBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	kv, err := topologytest.Start(t).JS.KeyValue(context.Background(), contract.BucketLeases)
	require.NoError(t, err)
	return kv
}

// TestDispatchRunnerCountWithoutServiceLock: the fair share counts the
// accounts without the service's lock, which is held while a runner stops
// and waits for its give-back check and acquire loop (both count): taking
// the lock there deadlocked a stopping replica (TestDispatchFailover once
// waited 30 s for a stop that normally takes milliseconds).
func TestDispatchRunnerCountWithoutServiceLock(t *testing.T) {
	s := &Service{runners: map[string]*accountRunner{"a": nil, "b": nil}}
	s.numRunners.Store(2)
	share := s.newShare() // what Run uses
	s.mu.Lock()
	defer s.mu.Unlock()
	got := make(chan int, 1)
	go func() { got <- share.Total() }()
	select {
	case n := <-got:
		require.Equal(t, 2, n)
	case <-time.After(2 * time.Second):
		t.Fatal("counting the accounts waits for the service's lock")
	}
}

// TestRefreshPhaseSpreads checks that sessions opened together do not
// refresh their leases in step: the first refresh falls anywhere in the
// period's last nine tenths.
func TestRefreshPhaseSpreads(t *testing.T) {
	lo, hi := lease.Refresh, time.Duration(0)
	for range 1000 {
		d := refreshPhase()
		if d < lease.Refresh/10 || d >= lease.Refresh {
			t.Fatalf("refreshPhase() = %v, want in [%v, %v)", d, lease.Refresh/10, lease.Refresh)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if hi-lo < lease.Refresh/2 {
		t.Fatalf("1,000 phases span only %v..%v; want them spread over the period", lo, hi)
	}
}
