package process

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestKillDispatchMidDigestWindow submits three tasks with one digest_key
// to the same ten recipients, kills (SIGKILL) the dispatch process once
// every job has joined its digest and before the window closes, and
// starts it again: exactly ten gateway requests, each carrying the three
// items, and exactly thirty sent events, each naming its carrier.
func TestKillDispatchMidDigestWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process kill test")
	}
	st := startStack(t, 0, 5)
	st.startAll("ingest", "render", "status")
	dispatch := st.start("dispatch")
	st.c.putHook(st.gw.URL, 100, 4)
	tasks := []string{"dk-a", "dk-b", "dk-c"}
	for _, id := range tasks {
		st.c.submitTask(contract.Task{ID: id, Channel: "webhook", Template: "news of " + id + " for {{.to}}",
			Recipients: pipelinetest.Recipients("u", 10), DigestKey: "news", DigestWindow: "8s",
			DigestTemplate: `{{.count}} updates:{{range .items}} [{{.task_id}}] {{.body}};{{end}}`})
	}
	natstest.Eventually(t, 30*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, st.c.js, "webhook") == 30
	}, "every job joined its digest")
	ledger := func() gateway.Ledger {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := gateway.FetchLedger(ctx, st.gw.URL)
		require.NoError(t, err)
		return l
	}
	require.Zero(t, ledger().Requests, "nothing sent before the window closed")
	dispatch.Kill()
	dispatch.Restart()

	for _, id := range tasks {
		p := st.c.pollProgress(id, time.Now().Add(60*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
		require.Equal(t, contract.StateSucceeded, p.State, "%s", id)
		require.Equal(t, 10, p.Sent, "%s sent", id)
	}
	time.Sleep(500 * time.Millisecond)
	l := ledger()
	require.Equal(t, 10, l.Requests, "one request per recipient")
	require.Equal(t, 10, l.AcceptedKeys())
	carriers := map[string]string{}
	for _, id := range tasks {
		require.Equal(t, 10, st.c.eventKinds(id)[contract.EventSent], "stored sent events of %s", id)
		for _, ev := range st.c.sentEvents(id) {
			require.NotEmpty(t, ev.CarriedBy)
			if prev, ok := carriers[ev.To]; ok {
				require.Equal(t, prev, ev.CarriedBy, "recipient %s", ev.To)
			}
			carriers[ev.To] = ev.CarriedBy
		}
	}
	require.Len(t, carriers, 10)
	for to, carrier := range carriers {
		body := l.Bodies[carrier]
		require.True(t, strings.HasPrefix(body, "3 updates:"), "body to %s: %q", to, body)
		for _, id := range tasks {
			require.Contains(t, body, "["+id+"] news of "+id+" for "+to+";")
		}
	}
}

// sentEvents reads a task's stored sent events.
func (c *chaosClient) sentEvents(taskID string) []contract.Event {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := c.js.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{contract.EventSubject(taskID, contract.EventSent)}})
	require.NoError(c.t, err)
	want := c.eventKinds(taskID)[contract.EventSent]
	var out []contract.Event
	for len(out) < want {
		batch, err := cons.Fetch(want-len(out), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(c.t, err)
		got := 0
		for m := range batch.Messages() {
			var ev contract.Event
			require.NoError(c.t, contract.DecodeEvent(m.Data(), &ev))
			out = append(out, ev)
			got++
		}
		require.NotZero(c.t, got, "sent events of %s: read %d of %d", taskID, len(out), want)
	}
	return out
}
