package lease

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestFairShareAfterAKill: two replicas share 4 leases, two each; one is
// killed (its connection closes, its announcement stays). The survivor,
// told its holder is gone as it takes the killed replica's leases, counts
// it out at once: it takes them within its share, and hands none back
// while the killed replica's last announcement (or one still on its way)
// would have counted, since nobody live could take them then. A replica
// joining later gets its share handed on.
func TestFairShareAfterAKill(t *testing.T) {
	t.Parallel()
	js, kv := leasesBucket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const prefix = "test-replica."
	total := func() int { return 4 }
	share := func(f *FairShare) int { f.mu.Lock(); defer f.mu.Unlock(); return f.share() }

	// The replica to be killed runs on a connection of its own.
	killedConn, killedKV := ownConnection(t, js)
	killed, survivor := NewFairShare(killedKV, prefix, total), NewFairShare(kv, prefix, total)
	go killed.Run(ctx)
	go survivor.Run(ctx)
	require.Eventually(t, func() bool { return share(killed) == 2 && share(survivor) == 2 }, 5*time.Second, 50*time.Millisecond,
		"each replica counts both")
	for _, f := range []*FairShare{killed, survivor} {
		require.True(t, f.MayTake(ctx))
		require.True(t, f.MayTake(ctx))
		require.False(t, f.MayTake(ctx), "two each")
	}

	killedConn.Close()
	killedAt := time.Now()
	// The survivor takes the killed replica's two leases, as status does
	// when the server says their holder is gone.
	for range 2 {
		survivor.Gone(OwnerID(killed.Replica))
		require.True(t, survivor.MayTake(ctx), "the killed replica no longer counts")
	}
	// Its last announcement, delivered late, does not count it back in.
	_, err := kv.Put(ctx, replicaKey(prefix, killed.Replica), []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	require.NoError(t, err)
	for time.Since(killedAt) < replicaStale+giveBackEvery {
		require.False(t, survivor.ShouldGiveBack(), "nothing handed back with no live replica to take it (%v after the kill)", time.Since(killedAt))
		require.Equal(t, 4, share(survivor))
		time.Sleep(100 * time.Millisecond)
	}

	joined := NewFairShare(kv, prefix, total)
	go joined.Run(ctx)
	gaveBack := 0
	require.Eventually(t, func() bool {
		if survivor.ShouldGiveBack() {
			gaveBack++
		}
		return gaveBack == 2
	}, 10*time.Second, 100*time.Millisecond, "a replica joining gets its share handed on")
}

// TestFairShareAsksWhetherReplicasAreGone: dispatch takes a killed
// replica's leases without knowing their holder first. Two replicas, each
// answering on its alive subject (Presence), share 4 leases, two each;
// one is killed. The survivor's MayTake, full at its share, asks the
// server about the replicas it counts and takes the two leases at once,
// long before the killed replica's announcement would have gone stale. A
// live replica is asked too, and still counts.
func TestFairShareAsksWhetherReplicasAreGone(t *testing.T) {
	t.Parallel()
	js, kv := leasesBucket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const prefix = "test-replica."
	total := func() int { return 4 }

	killedConn, killedKV := ownConnection(t, js)
	killed, survivor := NewFairShare(killedKV, prefix, total), NewFairShare(kv, prefix, total)
	for _, r := range []struct {
		f  *FairShare
		nc *nats.Conn
	}{{killed, killedConn}, {survivor, js.Conn()}} {
		p := NewPresence(r.nc, "test")
		stop, err := p.Answer(r.f.Replica, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		defer stop()
		r.f.ReplicaGone = p.Gone
		go r.f.Run(ctx)
	}
	require.Eventually(t, func() bool {
		survivor.mu.Lock()
		defer survivor.mu.Unlock()
		return survivor.share() == 2 && survivor.replicas[replicaKey(prefix, killed.Replica)] == killed.Replica
	}, 5*time.Second, 50*time.Millisecond, "the survivor counts both and knows the other's id")
	require.True(t, survivor.MayTake(ctx))
	require.True(t, survivor.MayTake(ctx))
	require.False(t, survivor.MayTake(ctx), "two each while both are live (the live one asked about)")

	killedConn.Close()
	killedAt := time.Now()
	require.Eventually(t, func() bool { return survivor.MayTake(ctx) }, 2*time.Second, 20*time.Millisecond)
	require.True(t, survivor.MayTake(ctx), "the killed replica's second lease too")
	took := time.Since(killedAt)
	require.Less(t, took, replicaStale/2, "taken once the server says it is gone, not when its announcement is stale")
	t.Logf("the killed replica's leases taken %v after the kill", took.Round(time.Millisecond))
	require.False(t, survivor.MayTake(ctx), "all four held")
}

// failingWatchKV fails its first Watch, as a server busy or restarting
// when the replica starts would.
type failingWatchKV struct {
	jetstream.KeyValue
	failed atomic.Bool
}

func (kv *failingWatchKV) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if kv.failed.CompareAndSwap(false, true) {
		return nil, errors.New("watch: server not ready")
	}
	return kv.KeyValue.Watch(ctx, keys, opts...)
}

// TestFairShareWatchesAgain: a replica whose first watch of the others
// fails starts it again and counts them; it neither stops following them
// (and takes every lease) nor stops announcing itself.
func TestFairShareWatchesAgain(t *testing.T) {
	t.Parallel()
	_, kv := leasesBucket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const prefix = "test-replica."
	total := func() int { return 4 }
	flaky := &failingWatchKV{KeyValue: kv}
	a, b := NewFairShare(flaky, prefix, total), NewFairShare(kv, prefix, total)
	go a.Run(ctx)
	go b.Run(ctx)
	share := func(f *FairShare) int { f.mu.Lock(); defer f.mu.Unlock(); return f.share() }
	require.Eventually(t, func() bool { return share(a) == 2 && share(b) == 2 }, 5*time.Second, 50*time.Millisecond,
		"both count both, the one whose first watch failed too")
	require.True(t, flaky.failed.Load())
}

// ownConnection is a connection of its own to js's server, to be closed
// as a killed process's is, and the leases bucket through it.
func ownConnection(t *testing.T, js jetstream.JetStream) (*nats.Conn, jetstream.KeyValue) {
	t.Helper()
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	njs, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := njs.KeyValue(context.Background(), contract.BucketLeases)
	require.NoError(t, err)
	return nc, kv
}
