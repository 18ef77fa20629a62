package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/fakes"
	"github.com/broadcastd/broadcast/internal/lease"
	"github.com/broadcastd/broadcast/internal/natstest"
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

// TestNoSendAfterTheConnectionDroppedSinceTheGrant: a step between a
// job's grant and its call (the frequency reservation, a KV write) that
// outlasts the connection is answered after the reconnect, when a standby
// that heard the holder gone may hold the lease already. The holder must
// then not make the call: the job waits for the lease. (Multi-process
// scenario seed 15166146, one run in about thirty: a recipient sent by
// two replicas after a nats-server restart, the old holder's send made
// 2 ms after it reconnected.)
func TestNoSendAfterTheConnectionDroppedSinceTheGrant(t *testing.T) {
	srv := topologytest.Start(t)
	js := srv.JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leases, err := js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)

	svc, err := New(js, Config{})
	require.NoError(t, err)
	var hooked atomic.Bool
	standbyHolds := make(chan struct{})
	testHookGranted = func(jobID string) {
		if !hooked.CompareAndSwap(false, true) {
			return
		}
		// The connection drops and comes back while the step runs, and
		// meanwhile another process takes the account.
		// (assert: this is the job's goroutine, not the test's.)
		defer close(standbyHolds)
		takeOverAfterReconnect(ctx, t, svc, leases, "acct")
	}
	t.Cleanup(func() { testHookGranted = nil })

	putAccounts(t, js, map[string]string{"acct": `{"channel":"sandbox","rate_per_sec":100,"burst":5,"concurrency":4}`})
	queueJobs(t, js, "regrant", "acct", 1)
	natstest.RunUntilCleanup(t, svc.Run)

	select {
	case <-standbyHolds:
	case <-ctx.Done():
		t.Fatal("the job was never granted")
	}
	// The standby holds the lease for 2 s (refreshing it), then lets go.
	holdAsStandby(ctx, t, leases, "acct", 4, func() {
		require.Zero(t, sentEvents(t, js, "regrant"), "sent while another process held the account")
	})
	require.Eventually(t, func() bool { return sentEvents(t, js, "regrant") == 1 }, 10*time.Second, 50*time.Millisecond,
		"sent once the account is this process's again")
}

// TestNoSendAfterTheLeaseWentDuringTheDial: the check before a job's call
// cannot see what the call waits for before the message leaves; an SMTP
// server slow to greet keeps the dial going while the connection drops
// and another process takes the account. The channel asks again once the
// connection is ready (channels.WithSendGate) and does not write the
// message; the job waits for the lease. Without that second look the
// message went out 1.5 s into the standby's hold.
func TestNoSendAfterTheLeaseWentDuringTheDial(t *testing.T) {
	srv := topologytest.Start(t)
	js := srv.JS
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leases, err := js.KeyValue(ctx, contract.BucketLeases)
	require.NoError(t, err)
	mail, err := fakes.StartSMTP(fakes.SMTPConfig{GreetDelay: 1500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(mail.Close)

	svc, err := New(js, Config{})
	require.NoError(t, err)
	var hooked atomic.Bool
	standbyHolds := make(chan struct{})
	testHookGranted = func(jobID string) {
		if !hooked.CompareAndSwap(false, true) {
			return
		}
		// Once the dial reached the server (which holds its greeting),
		// the connection drops and comes back, and another process takes
		// the account.
		go func() {
			defer close(standbyHolds)
			assert.Eventually(t, func() bool { return mail.Counts().Connections > 0 }, 10*time.Second, time.Millisecond)
			takeOverAfterReconnect(ctx, t, svc, leases, "mail")
		}()
	}
	t.Cleanup(func() { testHookGranted = nil })

	putAccounts(t, js, map[string]string{"mail": fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
		"from":"Shop <noreply@shop.example>","subject":"Hi","rate_per_sec":100,"burst":5,"concurrency":4,"timeout":"10s"}`, mail.Port())})
	job := contract.Job{ID: contract.JobID("dial", 0, false), TaskID: "dial", Index: 0, To: "user@example.com",
		Body: "hi", Channel: "smtp", Account: "mail", Priority: contract.PriorityNormal, MaxAttempts: 3}
	data, err := json.Marshal(&job)
	require.NoError(t, err)
	_, err = js.Publish(ctx, contract.JobSubject("mail", contract.PriorityNormal), data)
	require.NoError(t, err)
	natstest.RunUntilCleanup(t, svc.Run)

	select {
	case <-standbyHolds:
	case <-ctx.Done():
		t.Fatal("the job was never granted")
	}
	// The standby holds the lease for 3 s (refreshing it), past the
	// greeting, then lets go.
	holdAsStandby(ctx, t, leases, "mail", 6, func() {
		require.Empty(t, mail.Received(), "sent while another process held the account")
	})
	require.Eventually(t, func() bool { return sentEvents(t, js, "dial") == 1 }, 20*time.Second, 50*time.Millisecond,
		"sent once the account is this process's again")
	require.Len(t, mail.Received(), 1)
}

// takeOverAfterReconnect drops svc's connection and waits for it to come
// back, then takes account's lease as another process would.
// (assert: it runs on svc's goroutines, not the test's.)
func takeOverAfterReconnect(ctx context.Context, t *testing.T, svc *Service, leases jetstream.KeyValue, account string) {
	_, lost := svc.conn.State()
	assert.NoError(t, svc.js.Conn().ForceReconnect())
	assert.Eventually(t, func() bool { up, n := svc.conn.State(); return up && n > lost }, 10*time.Second, 5*time.Millisecond)
	_, err := leases.Put(ctx, account, []byte("standby"))
	assert.NoError(t, err)
}

// holdAsStandby keeps account's lease for halves half seconds, running
// check before each refresh, then lets it go.
func holdAsStandby(ctx context.Context, t *testing.T, leases jetstream.KeyValue, account string, halves int, check func()) {
	for range halves {
		time.Sleep(500 * time.Millisecond)
		check()
		_, err := leases.Put(ctx, account, []byte("standby"))
		require.NoError(t, err)
	}
	require.NoError(t, leases.Delete(ctx, account))
}
