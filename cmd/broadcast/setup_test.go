package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/shared"
)

// startServer runs an embedded JetStream server without the topology and
// points NATS_URL at it.
func startServer(t *testing.T) {
	t.Helper()
	t.Setenv("NATS_URL", natstest.Start(t).URL)
	t.Setenv("NATS_USER", "")
	t.Setenv("NATS_PASSWORD", "")
	t.Setenv("NATS_CREDS", "")
}

// TestSetupCommand: `broadcast setup` creates the topology and says so; a
// second run leaves it as it is.
func TestSetupCommand(t *testing.T) {
	startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, runSetup(ctx, nil, &out))
	require.Regexp(t, `(?m)^created +stream TASKS +replicas 1$`, out.String())
	require.Regexp(t, `(?m)^created +object store broadcast_status +replicas 1$`, out.String())
	require.Contains(t, out.String(), fmt.Sprintf("topology in place: %d created, 0 updated, 0 unchanged\n", topologyParts()))

	out.Reset()
	require.NoError(t, runSetup(ctx, nil, &out))
	require.Regexp(t, `(?m)^unchanged +KV bucket broadcast_ledger +replicas 1$`, out.String())
	require.Contains(t, out.String(), fmt.Sprintf("topology in place: 0 created, 0 updated, %d unchanged\n", topologyParts()))
}

// TestServiceWithoutSetup: a service started where `broadcast setup` never
// ran creates nothing, and fails naming what is missing and what to run.
func TestServiceWithoutSetup(t *testing.T) {
	startServer(t)
	t.Setenv("DASHBOARD_ADDR", "off")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := runServiceCommand(ctx, "ingest", nil)
	require.ErrorContains(t, err, "waiting for the topology: topology not in place (run `broadcast setup`): stream TASKS is missing;")
	require.ErrorContains(t, err, "object store broadcast_status is missing")
}

// TestSetupKeepsClusterReplicas: on a three-node cluster whose topology
// has three replicas, setup without -replicas leaves them; with -replicas
// it changes them.
func TestSetupKeepsClusterReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the three-node cluster test")
	}
	c := pipelinetest.StartCluster(t, natstest.ClusterOptions{})
	t.Setenv("NATS_URL", c.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, runSetup(ctx, nil, &out))
	require.Contains(t, out.String(), fmt.Sprintf("topology in place: 0 created, 0 updated, %d unchanged\n", topologyParts()))
	require.Regexp(t, `(?m)^unchanged +stream JOBS +replicas 3$`, out.String())

	out.Reset()
	require.NoError(t, runSetup(ctx, []string{"-replicas", "1"}, &out))
	require.Contains(t, out.String(), fmt.Sprintf("topology in place: 0 created, %d updated, 0 unchanged\n", topologyParts()))
	require.Regexp(t, `(?m)^updated +stream JOBS +replicas 1$`, out.String())
}

// topologyParts is how many streams, buckets and object stores setup makes.
func topologyParts() int {
	c := shared.TopologyConfig{}
	return len(shared.Streams(c)) + len(shared.Buckets(c)) + len(shared.ObjectStores(c))
}
