package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// fastRetries is the pipeline with dispatch's backoff cut to 50 ms-500 ms,
// so retries take a test's seconds, not minutes.
func fastRetries() pipelinetest.PipelineConfig {
	return pipelinetest.PipelineConfig{Dispatch: dispatch.Config{BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond}}
}

// withSecrets makes dispatch read secrets from a map instead of the
// process environment (tests run in parallel).
func withSecrets(secrets map[string]string) pipelinetest.PipelineConfig {
	cfg := fastRetries()
	cfg.Dispatch.Getenv = func(name string) string { return secrets[name] }
	return cfg
}

// webhookAccount is an account JSON for a webhook endpoint with extra fields.
func webhookAccount(endpoint string, fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return fmt.Sprintf(`{"channel":"webhook","endpoint":%q%s}`, endpoint, fields)
}

// recipients and recipientsWithRejects build recipient lists (see
// pipelinetest.Recipients and RecipientsWithRejects).
var (
	recipients            = pipelinetest.Recipients
	recipientsWithRejects = pipelinetest.RecipientsWithRejects
)

// submit publishes a task as JSON without a Nats-Msg-Id, so only ingest's
// own ledger can recognise a repeated id.
func submit(t *testing.T, ts *pipelinetest.Server, task any) {
	t.Helper()
	var data []byte
	switch v := task.(type) {
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		var err error
		data, err = json.Marshal(v)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ts.JS.Publish(ctx, contract.SubjectTasks, data)
	require.NoError(t, err)
}

// submitWithMsgID publishes raw bytes with a Nats-Msg-Id header.
func submitWithMsgID(t *testing.T, ts *pipelinetest.Server, data []byte, msgID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := nats.NewMsg(contract.SubjectTasks)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	_, err := ts.JS.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// putObject stores a recipient list in the broadcast_recipients object
// store.
func putObject(t *testing.T, ts *pipelinetest.Server, name, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs, err := ts.JS.ObjectStore(ctx, contract.BucketRecipients)
	require.NoError(t, err)
	_, err = obs.PutString(ctx, name, data)
	require.NoError(t, err)
}

// control sends an operator action for a task and returns the reply.
func control(t *testing.T, ts *pipelinetest.Server, taskID, action string) *contract.ControlReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := client.Control(ctx, ts.NC, taskID, action)
	require.NoError(t, err)
	return r
}

// kvGet reads a key of a bucket.
func kvGet(t *testing.T, ts *pipelinetest.Server, bucket, key string) (jetstream.KeyValueEntry, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, bucket)
	require.NoError(t, err)
	return kv.Get(ctx, key)
}

// accountHealth reads an account's health value, or nil.
func accountHealth(t *testing.T, ts *pipelinetest.Server, name string) *contract.AccountHealth {
	t.Helper()
	e, err := kvGet(t, ts, contract.BucketHealth, name)
	if err != nil {
		return nil
	}
	var h contract.AccountHealth
	require.NoError(t, json.Unmarshal(e.Value(), &h))
	return &h
}

// waitAccountHealth waits until the account's health value (KV
// broadcast_health, written by dispatch shortly after a change) exists
// and ok holds for it (nil: any value), and returns it.
func waitAccountHealth(t *testing.T, ts *pipelinetest.Server, name string, ok func(*contract.AccountHealth) bool) *contract.AccountHealth {
	t.Helper()
	var h *contract.AccountHealth
	natstest.Eventually(t, 10*time.Second, func() bool {
		h = accountHealth(t, ts, name)
		return h != nil && (ok == nil || ok(h))
	}, "health of account %s", name)
	return h
}

// deadLetters reads every dead letter of a task.
func deadLetters(t *testing.T, ts *pipelinetest.Server, taskID string) []contract.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ts.JS.OrderedConsumer(ctx, contract.StreamDead, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.DeadSubject(taskID)}})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []contract.DeadLetter
	for uint64(len(out)) < info.NumPending {
		b, err := c.Fetch(int(min(100, info.NumPending-uint64(len(out)))), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range b.Messages() {
			var d contract.DeadLetter
			require.NoError(t, json.Unmarshal(m.Data(), &d))
			out = append(out, d)
		}
	}
	return out
}

// eventsOf filters events by kind.
func eventsOf(evs []contract.Event, kind contract.EventKind) []contract.Event {
	var out []contract.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// countByKind tallies events per kind.
func countByKind(evs []contract.Event) map[contract.EventKind]int {
	out := map[contract.EventKind]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}

// waitCount polls until count() reaches want or timeout passes.
func waitCount(t *testing.T, timeout time.Duration, want int, count func() int, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var n int
	for time.Now().Before(deadline) {
		if n = count(); n >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.FailNowf(t, "timed out", "%s: %d of %d after %s", what, n, want, timeout)
}
