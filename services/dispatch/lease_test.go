package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// leasesBucket starts a JetStream server with the topology and returns the
// leases bucket.
func leasesBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	kv, err := topologyJS(t).KeyValue(context.Background(), contract.BucketLeases)
	require.NoError(t, err)
	return kv
}

// TestDispatchLeaseOneOwner: one owner at a time; a released lease is taken
// at once; a lease nobody refreshes (a crashed owner) is taken only after
// the bucket's TTL, and the old owner stopped counting it valid at least
// leaseMargin before that; the old owner then learns it lost the lease.
func TestDispatchLeaseOneOwner(t *testing.T) {
	t.Parallel()
	kv := leasesBucket(t)
	ctx := context.Background()
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, shared.LeaseTTL, st.TTL())
	a, b, c := newLease(kv, "acct", st.TTL()), newLease(kv, "acct", st.TTL()), newLease(kv, "acct", st.TTL())
	require.NotEqual(t, a.owner, b.owner)

	ok, err := a.tryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, a.valid())
	ok, err = b.tryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a held lease is not taken")
	require.NoError(t, a.refresh(ctx))
	require.False(t, b.valid())

	// A graceful stop: released, taken at once.
	require.NoError(t, a.release(ctx))
	require.False(t, a.valid())
	ok, err = b.tryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok, "a released lease is taken at once")

	// A crash: b stops refreshing. c keeps trying, as a runner does.
	require.NoError(t, b.refresh(ctx))
	bValidUntil := b.until()
	var takenAt time.Time
	for deadline := time.Now().Add(3 * shared.LeaseTTL); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ok, err := c.tryAcquire(ctx)
		require.NoError(t, err)
		if ok {
			takenAt = time.Now()
			break
		}
	}
	require.False(t, takenAt.IsZero(), "an abandoned lease expires")
	gap := takenAt.Sub(bValidUntil)
	t.Logf("abandoned lease taken %s after the old owner stopped counting it valid (margin %s, TTL %s)", gap.Round(time.Millisecond), leaseMargin, shared.LeaseTTL)
	require.False(t, b.valid())
	require.GreaterOrEqual(t, gap, leaseMargin-100*time.Millisecond, "no overlap: the old owner stopped well before anyone else could start")
	require.Less(t, gap, leaseMargin+2*time.Second, "taken over soon after the TTL")
	require.ErrorIs(t, b.refresh(ctx), errLeaseLost, "the old owner learns it lost the lease")
	require.NoError(t, b.release(ctx), "releasing a lost lease touches nobody else's")
	ok, err = a.tryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "c still holds it")
	require.True(t, c.valid())
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
	go func() { got <- share.total() }()
	select {
	case n := <-got:
		require.Equal(t, 2, n)
	case <-time.After(2 * time.Second):
		t.Fatal("counting the accounts waits for the service's lock")
	}
}
