package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

// TestDispatchLeaseOfAGoneHolder: a lease whose holder's process still
// answers on its alive subject is not taken before its TTL; once that
// process's connection closes (kill -9), a standby takes it at its next
// try, and the old holder learns it lost it. A holder counts its lease
// invalid from the moment its connection is down until a refresh succeeds
// after the reconnect, so the early take-over never overlaps its sends.
func TestDispatchLeaseOfAGoneHolder(t *testing.T) {
	t.Parallel()
	js := topologyJS(t)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)

	// The holder answers on its own connection, which the test closes
	// as a killed process's would be.
	holderConn, err := nats.Connect(js.Conn().ConnectedUrl())
	require.NoError(t, err)
	holderReplica := newReplicaID()
	stopAnswering, err := newPresence(holderConn).answer(holderReplica, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer stopAnswering()

	up, losses := true, uint64(0)
	var connMu sync.Mutex
	holder := newLease(kv, "acct", st.TTL())
	holder.owner = ownerID(holderReplica)
	holder.conn = func() (bool, uint64) { connMu.Lock(); defer connMu.Unlock(); return up, losses }
	standby := newLease(kv, "acct", st.TTL())
	standby.holderGone = newPresence(js.Conn()).gone

	ok, err := holder.tryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = standby.tryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a holder that answers keeps its lease")

	// Its connection down: the holder starts no send; back up after a
	// loss, it starts none until its lease is confirmed again.
	connMu.Lock()
	up = false
	connMu.Unlock()
	require.False(t, holder.valid(), "no send while the connection is down")
	connMu.Lock()
	up, losses = true, 1
	connMu.Unlock()
	require.False(t, holder.valid(), "no send after a reconnect before a refresh")
	require.NoError(t, holder.refresh(ctx))
	require.True(t, holder.valid())

	holderConn.Close()
	time.Sleep(presenceCache) // the standby's last answer was "alive"
	start := time.Now()
	ok, err = standby.tryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok, "the lease of a closed connection is taken at once")
	require.Equal(t, holder.owner, standby.tookFrom)
	t.Logf("taken %s after the holder's connection closed; its lease had %s left", time.Since(start).Round(time.Millisecond), time.Until(holder.until()).Round(time.Millisecond))
	require.Less(t, time.Since(start), time.Second)
	require.ErrorIs(t, holder.refresh(ctx), errLeaseLost, "the old holder learns it lost the lease")
	require.True(t, standby.valid())
}
