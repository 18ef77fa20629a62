package pipelinetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// DigestItemsWaiting counts the items of channel's open digests, read from
// their entries in the internal ledger bucket (dispatch's digest.go: keys
// dg=<channel>.<hash>.<hash>, values with a state and an "items" list), so
// a test knows every job has joined its digest before it kills or pauses.
func DigestItemsWaiting(t testing.TB, js jetstream.JetStream, channel string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketLedger)
	require.NoError(t, err)
	keys, err := kv.ListKeysFiltered(ctx, "dg="+channel+".>")
	require.NoError(t, err)
	n := 0
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue // finished and deleted meanwhile
		}
		var d struct {
			State string            `json:"state"`
			Items []json.RawMessage `json:"items"`
		}
		require.NoError(t, json.Unmarshal(e.Value(), &d))
		if d.State == "open" {
			n += len(d.Items)
		}
	}
	return n
}
