package process

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestKillDispatchReplicaHandsOverEveryAccount: two dispatch processes
// share four accounts, two each (the fair share), when one is killed
// (SIGKILL) mid-task. The survivor already holds its share, so it may take
// the killed process's accounts only once it no longer counts that
// process: it asks the server (lease.Presence) instead of waiting for the
// process's last announcement to go stale (3 s). Each of the killed
// process's accounts must send again within 3 s of the kill, and the
// gateway's ledger must show every recipient once, repeated only for
// sends in flight at the kill.
func TestKillDispatchReplicaHandsOverEveryAccount(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process kill test")
	}
	const (
		n           = 4000
		accounts    = 4
		rate        = 100 // per account
		concurrency = 4
	)
	st := startStack(t, 5*time.Millisecond, 5)
	st.startAll("ingest", "render", "status")
	replicas := st.replicas(2, "dispatch")
	names := make([]string, accounts)
	for i := range names {
		names[i] = "hook-" + strconv.Itoa(i)
		st.c.putAccount(names[i], fmt.Sprintf(`{"channel":"webhook","endpoint":"%s/send","rate_per_sec":%d,"min_rate_per_sec":%d,"burst":10,"concurrency":%d}`,
			st.gw.URL, rate, rate, concurrency))
	}
	// When each account's sent events arrive (core subscription on the
	// events' subjects: what the services publish, as they publish it).
	var mu sync.Mutex
	lastSent := map[string]time.Time{}
	var resumed map[string]time.Time // set at the kill: first sent event after it, per account
	sub, err := st.c.js.Conn().Subscribe(contract.EventSubject("kill-accounts", contract.EventSent), func(m *nats.Msg) {
		var ev contract.Event
		if contract.DecodeEvent(m.Data, &ev) != nil {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		lastSent[ev.Account] = now
		if resumed != nil {
			if _, ok := resumed[ev.Account]; !ok {
				resumed[ev.Account] = now
			}
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()

	task := contract.Task{ID: "kill-accounts", Channel: "webhook", Template: "Hello {{.to}}",
		Recipients: pipelinetest.Recipients("ka", n), Accounts: names}
	st.c.submitTask(task)

	// Wait until every account sends, two from each process.
	holders := func() map[string]int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := st.c.js.KeyValue(ctx, contract.BucketLeases)
		require.NoError(t, err)
		out := map[string]int{}
		for _, a := range names {
			if e, err := kv.Get(ctx, a); err == nil {
				if pid, ok := ownerPid(string(e.Value())); ok {
					out[a] = pid
				}
			}
		}
		return out
	}
	natstest.Eventually(t, 60*time.Second, func() bool {
		h := holders()
		per := map[int]int{}
		for _, pid := range h {
			per[pid]++
		}
		mu.Lock()
		defer mu.Unlock()
		return len(h) == accounts && per[replicas[0].Pid()] == 2 && per[replicas[1].Pid()] == 2 && len(lastSent) == accounts
	}, "four accounts sending, two per process")

	victim := replicas[0]
	var victimAccounts []string
	for a, pid := range holders() {
		if pid == victim.Pid() {
			victimAccounts = append(victimAccounts, a)
		}
	}
	require.Len(t, victimAccounts, 2)
	mu.Lock()
	killedAt := time.Now()
	victim.Kill()
	mu.Unlock()
	// Sends the dead process had in flight may still be published for a
	// moment; count from 200 ms after the kill.
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	resumed = map[string]time.Time{}
	mu.Unlock()
	// The survivor takes both leases once the server says the process is
	// gone (about a second: a cached answer, then the next try), not
	// after its last announcement went stale (2-3 s after the kill); the
	// jobs the dead process held come back after the ack wait (2 s).
	var tookOver time.Duration
	for {
		h := holders()
		if h[victimAccounts[0]] == replicas[1].Pid() && h[victimAccounts[1]] == replicas[1].Pid() {
			tookOver = time.Since(killedAt)
			break
		}
		require.Less(t, time.Since(killedAt), 30*time.Second, "the survivor never took the killed process's accounts")
		time.Sleep(20 * time.Millisecond)
	}
	natstest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range victimAccounts {
			if _, ok := resumed[a]; !ok {
				return false
			}
		}
		return true
	}, "the killed process's accounts send again")
	mu.Lock()
	gaps := map[string]time.Duration{}
	for _, a := range victimAccounts {
		gaps[a] = resumed[a].Sub(killedAt)
	}
	mu.Unlock()
	t.Logf("kill of pid %d: its accounts %v taken over after %v, sending again after %v", victim.Pid(), victimAccounts,
		tookOver.Round(time.Millisecond), gaps)

	p := st.c.pollProgress(task.ID, time.Now().Add(120*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
	cancel()
	require.NoError(t, err)
	t.Logf("requests %d, accepted keys %d, duplicates %d; progress %s sent=%d", l.Requests, l.AcceptedKeys(), l.Duplicates, p.State, p.Sent)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	require.Equal(t, n, l.AcceptedKeys(), "every recipient accepted")
	require.LessOrEqual(t, l.Duplicates, 2*concurrency, "repeats only for sends in flight at the kill")
	require.Less(t, tookOver, 2500*time.Millisecond, "the killed process's accounts taken over once the server says it is gone")
	for a, g := range gaps {
		require.Less(t, g, 3*time.Second, "account %s sends again within 3 s of the kill", a)
	}
}
