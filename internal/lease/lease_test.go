package lease

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
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// leasesBucket starts a JetStream server with the topology and returns its
// client and the leases bucket.
func leasesBucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := topologytest.Start(t).JS
	kv, err := js.KeyValue(context.Background(), contract.BucketLeases)
	require.NoError(t, err)
	return js, kv
}

// TestLeaseOneOwner: one owner at a time; a released lease is taken
// at once; a lease nobody refreshes (a crashed owner) is taken only after
// the bucket's TTL, and the old owner stopped counting it valid at least
// Margin before that; the old owner then learns it lost the lease.
func TestLeaseOneOwner(t *testing.T) {
	t.Parallel()
	_, kv := leasesBucket(t)
	ctx := context.Background()
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, shared.LeaseTTL, st.TTL())
	a, b, c := New(kv, "acct", st.TTL()), New(kv, "acct", st.TTL()), New(kv, "acct", st.TTL())
	require.NotEqual(t, a.Owner, b.Owner)

	ok, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, a.Valid())
	ok, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a held lease is not taken")
	require.NoError(t, a.Refresh(ctx))
	require.False(t, b.Valid())

	// A graceful stop: released, taken at once.
	require.NoError(t, a.Release(ctx))
	require.False(t, a.Valid())
	ok, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok, "a released lease is taken at once")

	// A crash: b stops refreshing. c keeps trying, as a runner does.
	require.NoError(t, b.Refresh(ctx))
	bValidUntil := b.Until()
	var takenAt time.Time
	for deadline := time.Now().Add(3 * shared.LeaseTTL); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ok, err := c.TryAcquire(ctx)
		require.NoError(t, err)
		if ok {
			takenAt = time.Now()
			break
		}
	}
	require.False(t, takenAt.IsZero(), "an abandoned lease expires")
	gap := takenAt.Sub(bValidUntil)
	t.Logf("abandoned lease taken %s after the old owner stopped counting it valid (margin %s, TTL %s)", gap.Round(time.Millisecond), Margin, shared.LeaseTTL)
	require.False(t, b.Valid())
	require.GreaterOrEqual(t, gap, Margin-100*time.Millisecond, "no overlap: the old owner stopped well before anyone else could start")
	require.Less(t, gap, Margin+2*time.Second, "taken over soon after the TTL")
	require.ErrorIs(t, b.Refresh(ctx), ErrLost, "the old owner learns it lost the lease")
	require.NoError(t, b.Release(ctx), "releasing a lost lease touches nobody else's")
	ok, err = a.TryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "c still holds it")
	require.True(t, c.Valid())
}

// TestLeaseOfAGoneHolder: a lease whose holder's process still
// answers on its alive subject is not taken before its TTL; once that
// process's connection closes (kill -9), a standby takes it at its next
// try, and the old holder learns it lost it. A holder counts its lease
// invalid from the moment its connection is down until a refresh succeeds
// after the reconnect, so the early take-over never overlaps its sends.
func TestLeaseOfAGoneHolder(t *testing.T) {
	t.Parallel()
	js, kv := leasesBucket(t)
	ctx := context.Background()
	st, err := kv.Status(ctx)
	require.NoError(t, err)

	// The holder answers on its own connection, which the test closes
	// as a killed process's would be.
	holderConn, err := nats.Connect(js.Conn().ConnectedUrl())
	require.NoError(t, err)
	holderReplica := NewReplicaID()
	stopAnswering, err := NewPresence(holderConn, "dispatch").Answer(holderReplica, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer stopAnswering()

	up, losses := true, uint64(0)
	var connMu sync.Mutex
	holder := New(kv, "acct", st.TTL())
	holder.Owner = OwnerID(holderReplica)
	holder.Conn = func() (bool, uint64) { connMu.Lock(); defer connMu.Unlock(); return up, losses }
	standby := New(kv, "acct", st.TTL())
	standby.HolderGone = NewPresence(js.Conn(), "dispatch").Gone

	ok, err := holder.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = standby.TryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a holder that answers keeps its lease")

	// Its connection down: the holder starts no send; back up after a
	// loss, it starts none until its lease is confirmed again.
	connMu.Lock()
	up = false
	connMu.Unlock()
	require.False(t, holder.Valid(), "no send while the connection is down")
	connMu.Lock()
	up, losses = true, 1
	connMu.Unlock()
	require.False(t, holder.Valid(), "no send after a reconnect before a refresh")
	require.NoError(t, holder.Refresh(ctx))
	require.True(t, holder.Valid())

	holderConn.Close()
	time.Sleep(PresenceCache) // the standby's last answer was "alive"
	start := time.Now()
	ok, err = standby.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok, "the lease of a closed connection is taken at once")
	require.Equal(t, holder.Owner, standby.TookFrom)
	t.Logf("taken %s after the holder's connection closed; its lease had %s left", time.Since(start).Round(time.Millisecond), time.Until(holder.Until()).Round(time.Millisecond))
	require.Less(t, time.Since(start), time.Second)
	require.ErrorIs(t, holder.Refresh(ctx), ErrLost, "the old holder learns it lost the lease")
	require.True(t, standby.Valid())
}

// TestLeaseOfAHolderBackAfterAServerRestart: after a server restart every
// process reconnects in its own time, so a standby can hear "no
// responders" for a holder that is only slow to come back. Once the
// holder is back and has confirmed its lease, that earlier answer must not
// take the lease: the holder counts it valid for seconds and would send
// beside the standby (multi-process scenario seed 15166146: one recipient
// sent by both dispatch replicas 127 ms apart after nats-server was killed).
func TestLeaseOfAHolderBackAfterAServerRestart(t *testing.T) {
	t.Parallel()
	js, kv := leasesBucket(t)
	ctx := context.Background()
	st, err := kv.Status(ctx)
	require.NoError(t, err)

	holderReplica := NewReplicaID()
	answer := func() *nats.Conn {
		nc, err := nats.Connect(js.Conn().ConnectedUrl())
		require.NoError(t, err)
		_, err = NewPresence(nc, "dispatch").Answer(holderReplica, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		return nc
	}
	first := answer()
	holder := New(kv, "acct", st.TTL())
	holder.Owner = OwnerID(holderReplica)
	presence := NewPresence(js.Conn(), "dispatch")
	standby := New(kv, "acct", st.TTL())
	standby.HolderGone = presence.Gone

	ok, err := holder.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)

	// The holder away: the standby hears that nobody answers for it.
	first.Close()
	require.Eventually(t, func() bool { return presence.Gone(ctx, holder.Owner) }, 5*time.Second, 50*time.Millisecond,
		"the server drops the closed connection's subscription")

	// Back, answering again, its lease confirmed at a new revision.
	back := answer()
	defer back.Close()
	require.NoError(t, holder.Refresh(ctx))
	require.True(t, holder.Valid())

	ok, err = standby.TryAcquire(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a holder that answers again keeps its lease, whatever was heard before")
	require.NoError(t, holder.Refresh(ctx), "the holder still has it")
}

// TestLeaseRefreshStoredAfterItsAnswerTimedOut: a refresh the server
// stores after the holder stopped waiting for its answer leaves the
// holder one revision behind. Its next refresh finds the lease still
// naming it and keeps it (under load this ended every account's session
// at once); a lease that names someone else is lost; and a release after
// such a refresh still frees the lease at once.
func TestLeaseRefreshStoredAfterItsAnswerTimedOut(t *testing.T) {
	t.Parallel()
	_, kv := leasesBucket(t)
	ctx := context.Background()
	a, b := New(kv, "acct", shared.LeaseTTL), New(kv, "acct", shared.LeaseTTL)
	ok, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok)

	// What the timed-out refresh did on the server.
	late := func() {
		e, err := kv.Get(ctx, "acct")
		require.NoError(t, err)
		_, err = kv.Update(ctx, "acct", []byte(a.Owner), e.Revision())
		require.NoError(t, err)
	}
	late()
	before := a.Until()
	require.NoError(t, a.Refresh(ctx), "the lease still names its holder")
	require.True(t, a.Valid())
	require.True(t, a.Until().After(before), "the refresh confirmed it anew")
	require.NoError(t, a.Refresh(ctx), "and the holder is at the latest revision again")

	late()
	require.NoError(t, a.Release(ctx))
	ok, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	require.True(t, ok, "released at its later revision: taken at once")

	// Another holder's lease at a later revision is not taken back.
	e, err := kv.Get(ctx, "acct")
	require.NoError(t, err)
	a.mu.Lock()
	a.rev, a.validUntil = e.Revision()-1, time.Now().Add(time.Second)
	a.mu.Unlock()
	require.ErrorIs(t, a.Refresh(ctx), ErrLost)
	require.False(t, a.Valid())
	require.NoError(t, b.Refresh(ctx), "b keeps it")
	require.True(t, b.Valid())
}
