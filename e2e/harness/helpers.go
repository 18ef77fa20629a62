package harness

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

// FastRetries is the pipeline with dispatch's backoff cut to 50 ms-500 ms,
// so retries take a test's seconds, not minutes.
func FastRetries() pipelinetest.PipelineConfig {
	return pipelinetest.PipelineConfig{Dispatch: dispatch.Config{BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond}}
}

// WithSecrets makes dispatch read secrets from a map instead of the
// process environment (tests run in parallel).
func WithSecrets(secrets map[string]string) pipelinetest.PipelineConfig {
	cfg := FastRetries()
	cfg.Dispatch.Getenv = func(name string) string { return secrets[name] }
	return cfg
}

// WebhookAccount is an account JSON for a webhook endpoint with extra fields.
func WebhookAccount(endpoint string, fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return fmt.Sprintf(`{"channel":"webhook","endpoint":%q%s}`, endpoint, fields)
}

// Submit publishes a task as JSON without a Nats-Msg-Id, so only ingest's
// own ledger can recognise a repeated id.
func Submit(t *testing.T, ts *pipelinetest.Server, task any) {
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

// SubmitWithMsgID publishes raw bytes with a Nats-Msg-Id header.
func SubmitWithMsgID(t *testing.T, ts *pipelinetest.Server, data []byte, msgID string) {
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

// PutObject stores a recipient list in the broadcast_recipients object
// store.
func PutObject(t *testing.T, ts *pipelinetest.Server, name, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs, err := ts.JS.ObjectStore(ctx, contract.BucketRecipients)
	require.NoError(t, err)
	_, err = obs.PutString(ctx, name, data)
	require.NoError(t, err)
}

// Control sends an operator action for a task and returns the reply.
func Control(t *testing.T, ts *pipelinetest.Server, taskID, action string) *contract.ControlReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := client.Control(ctx, ts.NC, taskID, action)
	require.NoError(t, err)
	return r
}

// KVGet reads a key of a bucket.
func KVGet(t *testing.T, ts *pipelinetest.Server, bucket, key string) (jetstream.KeyValueEntry, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, bucket)
	require.NoError(t, err)
	return kv.Get(ctx, key)
}

// AccountHealth reads an account's health value, or nil.
func AccountHealth(t *testing.T, ts *pipelinetest.Server, name string) *contract.AccountHealth {
	t.Helper()
	e, err := KVGet(t, ts, contract.BucketHealth, name)
	if err != nil {
		return nil
	}
	var h contract.AccountHealth
	require.NoError(t, json.Unmarshal(e.Value(), &h))
	return &h
}

// WaitAccountHealth waits until the account's health value (KV
// broadcast_health, written by dispatch shortly after a change) exists
// and ok holds for it (nil: any value), and returns it.
func WaitAccountHealth(t *testing.T, ts *pipelinetest.Server, name string, ok func(*contract.AccountHealth) bool) *contract.AccountHealth {
	t.Helper()
	var h *contract.AccountHealth
	natstest.Eventually(t, 10*time.Second, func() bool {
		h = AccountHealth(t, ts, name)
		return h != nil && (ok == nil || ok(h))
	}, "health of account %s", name)
	return h
}

// DeadLetters reads every dead letter of a task.
func DeadLetters(t *testing.T, ts *pipelinetest.Server, taskID string) []contract.DeadLetter {
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

// PutSignals writes an account's provider signals as an operator would
// (nats kv put broadcast_signals <account> '<json>').
func PutSignals(t *testing.T, ts *pipelinetest.Server, account string, s contract.AccountSignals) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketSignals)
	require.NoError(t, err)
	if s.At.IsZero() {
		s.At = time.Now().UTC()
	}
	data, err := json.Marshal(&s)
	require.NoError(t, err)
	_, err = kv.Put(ctx, account, data)
	require.NoError(t, err)
}

// EventsOf filters events by kind.
func EventsOf(evs []contract.Event, kind contract.EventKind) []contract.Event {
	var out []contract.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// CountByKind tallies events per kind.
func CountByKind(evs []contract.Event) map[contract.EventKind]int {
	out := map[contract.EventKind]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}

// WaitCount polls until count() reaches want or timeout passes.
func WaitCount(t *testing.T, timeout time.Duration, want int, count func() int, what string) {
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
