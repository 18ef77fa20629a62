package process

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestFrequencyCapSurvivesKill: under a marketing cap of 1 per 24 h, four
// tasks to the same 400 recipients run at once through two accounts, with
// two dispatch processes; the holder of one account's lease is killed
// (SIGKILL) while it sends, and comes back. Every recipient gets exactly
// one message: no cap exceeded (a second task's message to anyone) and no
// send lost (a recipient whose reservation was made by the killed process
// is sent by the job that reserved it, after its redelivery). Progress
// agrees: n sent and 3n skipped with code frequency_cap over the tasks.
func TestFrequencyCapSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process kill test")
	}
	const (
		n     = 400
		tasks = 4
		rate  = 150
	)
	st := startStack(t, 5*time.Millisecond, 5)
	st.startAll("ingest", "render", "status")
	replicas := st.replicas(2, "dispatch")
	ctx := context.Background()
	kv, err := st.c.js.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	_, err = kv.Put(ctx, contract.PolicyDefault, []byte(`{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`))
	require.NoError(t, err)
	for _, a := range []string{"hook-a", "hook-b"} {
		st.c.putAccount(a, fmt.Sprintf(`{"channel":"webhook","endpoint":"%s/send","rate_per_sec":%d,"burst":10,"concurrency":8}`, st.gw.URL, rate))
	}
	people := pipelinetest.Recipients("fk", n)
	var ids []string
	for i := range tasks {
		id := fmt.Sprintf("fkill-%d", i)
		ids = append(ids, id)
		st.c.submitTask(contract.Task{ID: id, Channel: "webhook", Template: "offer " + id, Recipients: people,
			Accounts: []string{[]string{"hook-a", "hook-b"}[i%2]}})
	}
	ledger := func() gateway.Ledger {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, st.gw.URL)
		require.NoError(t, err)
		return l
	}
	// Kill while hook-a sends: its holder has sent for tasks 0 and 2, and a
	// third of the recipients are reserved. The replicas may take a second
	// or more to split the accounts (fair share), so wait for hook-a itself.
	sentByHookA := func(l gateway.Ledger) int {
		k := 0
		for i := range n {
			for _, id := range []string{ids[0], ids[2]} {
				if l.AcceptedByKey[contract.JobID(id, i, false)] > 0 {
					k++
				}
			}
		}
		return k
	}
	natstest.Eventually(t, 60*time.Second, func() bool {
		l := ledger()
		return l.Requests >= n/3 && sentByHookA(l) >= 20
	}, "hook-a sending before the kill")
	holder := leaseHolder(t, st.c, "hook-a", replicas)
	holder.Kill()
	atKill := ledger().Requests
	holder.Restart()

	sent, skipped := 0, 0
	for _, id := range ids {
		p := st.c.pollProgress(id, time.Now().Add(2*time.Minute), func(p *contract.Progress) bool { return p.State.Final() })
		sent, skipped = sent+p.Sent, skipped+p.Skipped
	}
	l := ledger()
	perRecipient := map[int]int{}
	for i := range n {
		for _, id := range ids {
			if l.AcceptedByKey[contract.JobID(id, i, false)] > 0 {
				perRecipient[i]++
			}
		}
	}
	counts := map[int]int{} // messages per recipient -> recipients
	for i := range n {
		counts[perRecipient[i]]++
	}
	t.Logf("killed the holder of hook-a (pid %d) after %d requests; gateway requests %d, accepted keys %d, duplicates %d; "+
		"recipients by messages received %v; progress sent %d skipped %d", holder.Pid(), atKill, l.Requests, l.AcceptedKeys(), l.Duplicates, counts, sent, skipped)
	require.Equal(t, map[int]int{1: n}, counts, "every recipient exactly one message")
	require.Equal(t, [2]int{n, (tasks - 1) * n}, [2]int{sent, skipped}, "sent, skipped")
	require.Equal(t, n, l.AcceptedKeys())
}
