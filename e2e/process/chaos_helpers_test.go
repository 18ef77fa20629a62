package process

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
	"github.com/broadcastd/broadcast/shared"
)

// chaosClient is the test's own connection to a nats-server run as a
// process: it submits, configures accounts and reads progress.
type chaosClient struct {
	t  *testing.T
	js jetstream.JetStream
}

// newChaosClient connects to url (reconnecting forever, so it survives a
// server restart) and ensures the topology, so buckets exist before any
// service has started.
func newChaosClient(t *testing.T, url string) *chaosClient {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, shared.EnsureTopology(ctx, js, shared.TopologyConfig{}))
	return &chaosClient{t: t, js: js}
}

// putAccount stores an account JSON in KV broadcast_accounts.
func (c *chaosClient) putAccount(name, account string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(c.t, err)
	_, err = kv.Put(ctx, name, []byte(account))
	require.NoError(c.t, err)
}

// putHook stores the webhook account "hook" sending to the gateway at
// gatewayURL, its rate pinned (min_rate_per_sec: the gateway's random
// answers are not what these tests are about), burst 10.
func (c *chaosClient) putHook(gatewayURL string, rate, concurrency int) {
	c.t.Helper()
	c.putAccount("hook", fmt.Sprintf(`{"channel":"webhook","endpoint":"%s/send","rate_per_sec":%d,"min_rate_per_sec":%d,"burst":10,"concurrency":%d}`,
		gatewayURL, rate, rate, concurrency))
}

// submitTask publishes task as JSON with client.Submit.
func (c *chaosClient) submitTask(task contract.Task) {
	c.t.Helper()
	data, err := json.Marshal(task)
	require.NoError(c.t, err)
	c.submit(data)
}

// submit publishes task with client.Submit.
func (c *chaosClient) submit(task []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := client.Submit(ctx, c.js, task)
	require.NoError(c.t, err)
}

// progress reads a task's progress; a task without one yet (or a read that
// failed while the server was busy) reads as the zero Progress.
func (c *chaosClient) progress(taskID string) *contract.Progress {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := client.Get(ctx, c.js, taskID)
	if err != nil {
		return &contract.Progress{}
	}
	return p
}

// pollProgress polls a task's progress every 50ms until cond holds or the
// deadline passes, and returns the last progress read.
func (c *chaosClient) pollProgress(taskID string, deadline time.Time, cond func(*contract.Progress) bool) *contract.Progress {
	for {
		p := c.progress(taskID)
		if cond(p) || !time.Now().Before(deadline) {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
}
