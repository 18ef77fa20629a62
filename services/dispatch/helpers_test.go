package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
)

// putAccounts stores each name's account JSON in broadcast_accounts.
func putAccounts(t *testing.T, js jetstream.JetStream, accounts map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	for name, value := range accounts {
		_, err = kv.Put(ctx, name, []byte(value))
		require.NoError(t, err)
	}
}

// queueJobs publishes n sandbox jobs of task on account's normal lane, as
// render would have.
func queueJobs(t *testing.T, js jetstream.JetStream, task, account string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		job := contract.Job{ID: contract.JobID(task, i, false), TaskID: task, Index: i, To: fmt.Sprintf("user-%d", i),
			Body: "hi", Channel: "sandbox", Account: account, Priority: contract.PriorityNormal, MaxAttempts: 3}
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = js.Publish(ctx, contract.JobSubject(account, contract.PriorityNormal), data)
		require.NoError(t, err)
	}
}

// runService runs a dispatch service with cfg until the test ends.
func runService(t *testing.T, js jetstream.JetStream, cfg Config) *Service {
	t.Helper()
	svc, err := New(js, cfg)
	require.NoError(t, err)
	natstest.RunUntilCleanup(t, svc.Run)
	return svc
}

// sentEvents counts task's sent events.
func sentEvents(t *testing.T, js jetstream.JetStream, task string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	events, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	subject := contract.EventSubject(task, contract.EventSent)
	info, err := events.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	// (The filter narrows Subjects; Msgs counts the whole stream.)
	return info.State.Subjects[subject]
}
