package shared_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// emptyServer starts a JetStream server without the topology.
func emptyServer(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.Start(t).JS
}

// ensure runs EnsureTopology and returns the action it reported per object.
func ensure(t *testing.T, js jetstream.JetStream) map[string]string {
	t.Helper()
	actions := map[string]string{}
	err := shared.EnsureTopology(context.Background(), js, shared.TopologyConfig{OnChange: func(c shared.TopologyChange) {
		require.Equal(t, 1, c.Replicas, "%s %s", c.Kind, c.Name)
		actions[c.Kind+" "+c.Name] = c.Action
	}})
	require.NoError(t, err)
	require.Len(t, actions, len(shared.TopologyStreams()))
	return actions
}

// only returns the actions other than "unchanged".
func only(actions map[string]string) map[string]string {
	out := map[string]string{}
	for k, a := range actions {
		if a != "unchanged" {
			out[k] = a
		}
	}
	return out
}

// TestCheckTopology: on an empty server every stream, bucket and object
// store is reported missing; EnsureTopology creates them (reporting
// "created"), then leaves them ("unchanged"), and puts back what was
// changed ("updated") after CheckTopology named it.
func TestCheckTopology(t *testing.T) {
	js := emptyServer(t)
	ctx := context.Background()
	err := shared.CheckTopology(ctx, js)
	var te *shared.TopologyError
	require.True(t, errors.As(err, &te), "%v", err)
	c := shared.TopologyConfig{}
	require.Len(t, te.Problems, len(shared.Streams(c))+len(shared.Buckets(c))+len(shared.ObjectStores(c)))
	require.Contains(t, te.Problems, "stream TASKS is missing")
	require.Contains(t, te.Problems, "stream LOOKUP is missing")
	require.Contains(t, te.Problems, "KV bucket broadcast_leases is missing")
	require.Contains(t, te.Problems, "stream RECEIPTS is missing")
	require.Contains(t, te.Problems, "KV bucket broadcast_provider_ids is missing")
	require.Contains(t, te.Problems, "KV bucket broadcast_suppressions is missing")
	require.Contains(t, te.Problems, "object store broadcast_status is missing")
	require.ErrorContains(t, err, "run `broadcast setup`")

	for k, a := range ensure(t, js) {
		require.Equal(t, "created", a, k)
	}
	require.NoError(t, shared.CheckTopology(ctx, js))
	require.Empty(t, only(ensure(t, js)), "a second run changes nothing")

	// An older JOBS without the parked subjects, and an accounts bucket
	// that keeps one value per key.
	jobs := shared.Streams(shared.TopologyConfig{})[2]
	require.Equal(t, contract.StreamJobs, jobs.Name)
	jobs.Subjects = jobs.Subjects[:2]
	_, err = js.UpdateStream(ctx, jobs)
	require.NoError(t, err)
	_, err = js.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: contract.BucketAccounts, History: 1, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	err = shared.CheckTopology(ctx, js)
	require.True(t, errors.As(err, &te), "%v", err)
	require.Equal(t, []string{
		"stream JOBS has subjects [broadcast.jobs.> broadcast.delay.>], want [broadcast.jobs.> broadcast.delay.> broadcast.parked.>]",
		"KV bucket broadcast_accounts keeps 1 values per key, want 5",
	}, te.Problems)

	require.Equal(t, map[string]string{"stream JOBS": "updated", "KV bucket broadcast_accounts": "updated"}, only(ensure(t, js)))
	require.NoError(t, shared.CheckTopology(ctx, js))
}

// TestWaitForTopology: a service started before `broadcast setup` logs
// that it waits and goes on once the topology is in place; one for which
// setup never runs fails after the wait, naming what is missing and what
// to run.
func TestWaitForTopology(t *testing.T) {
	js := emptyServer(t)
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	err := shared.WaitForTopology(context.Background(), js, time.Second, log)
	require.ErrorContains(t, err, "after waiting 1s: topology not in place (run `broadcast setup`): stream TASKS is missing; stream RENDER is missing;")
	require.Contains(t, logs.String(), `msg="waiting for the topology"`)

	done := make(chan error, 1)
	go func() { done <- shared.WaitForTopology(context.Background(), js, time.Minute, log) }()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, shared.EnsureTopology(context.Background(), js, shared.TopologyConfig{}))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitForTopology did not notice the topology")
	}
	require.Contains(t, logs.String(), `msg="topology in place"`)
}

// TestJobsTakesTheLanesOfManyAccounts: JOBS takes the three lane consumers
// of 400 accounts; the server's default of 1,000 consumers per stream
// refused the 1,001st, and dispatch sent nothing for the accounts beyond
// 333.
func TestJobsTakesTheLanesOfManyAccounts(t *testing.T) {
	js := emptyServer(t)
	ctx := context.Background()
	ensure(t, js)
	for i := range 400 {
		for _, p := range []contract.Priority{contract.PriorityHigh, contract.PriorityNormal, contract.PriorityLow} {
			name := fmt.Sprintf("many-%d", i)
			_, err := js.CreateOrUpdateConsumer(ctx, contract.StreamJobs, jetstream.ConsumerConfig{
				Durable: contract.DispatchConsumer(name, p), FilterSubject: contract.JobSubject(name, p),
				AckPolicy: jetstream.AckExplicitPolicy, MemoryStorage: true,
			})
			require.NoError(t, err, "consumer %d", 3*i)
		}
	}
	info, err := js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	require.Equal(t, 1200, info.CachedInfo().State.Consumers)
}

// TestOnlyTheIndexPersistsAsync: LOOKUP, a view status writes without
// waiting, is the one stream whose writes the server may batch; every
// stream whose acknowledgement a service relies on (a job queued, an event
// stored, a receipt taken) and every bucket is written before the server
// answers. A LOOKUP created before the setting keeps its mode, which the
// server cannot change in place, and setup still succeeds.
func TestOnlyTheIndexPersistsAsync(t *testing.T) {
	ctx := context.Background()
	persistAsync := func(js jetstream.JetStream) []string {
		var async []string
		for _, ts := range shared.TopologyStreams() {
			s, err := js.Stream(ctx, ts.Stream)
			require.NoError(t, err, ts.Stream)
			if s.CachedInfo().Config.PersistMode == jetstream.AsyncPersistMode {
				async = append(async, ts.Stream)
			}
		}
		return async
	}
	js := emptyServer(t)
	ensure(t, js)
	require.Equal(t, []string{contract.StreamLookup}, persistAsync(js))

	older := emptyServer(t)
	lookup := shared.Streams(shared.TopologyConfig{})[5]
	require.Equal(t, contract.StreamLookup, lookup.Name)
	lookup.PersistMode = jetstream.DefaultPersistMode
	_, err := older.CreateStream(ctx, lookup)
	require.NoError(t, err)
	actions := ensure(t, older)
	require.Equal(t, "unchanged", actions["stream LOOKUP"])
	require.Empty(t, persistAsync(older))
	require.NoError(t, shared.CheckTopology(ctx, older))
}
