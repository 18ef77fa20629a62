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

// DigestEntry is what a test reads of one digest's entry in the internal
// ledger bucket (dispatch's digest.go: keys dg=<channel>.<hash>.<hash>).
type DigestEntry struct {
	State string         `json:"state"`
	Items []contract.Job `json:"items"`
	// Out are items taken out and still to be published alone.
	Out []contract.Job `json:"out"`
}

// DigestEntries reads the entries of channel's digests; one finished and
// deleted meanwhile is left out.
func DigestEntries(t testing.TB, js jetstream.JetStream, channel string) []DigestEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, contract.BucketLedger)
	require.NoError(t, err)
	keys, err := kv.ListKeysFiltered(ctx, "dg="+channel+".>")
	require.NoError(t, err)
	var out []DigestEntry
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var d DigestEntry
		require.NoError(t, json.Unmarshal(e.Value(), &d))
		out = append(out, d)
	}
	return out
}

// DigestItemsWaiting counts the items of channel's open digests, so a
// test knows every job has joined its digest before it kills or pauses.
func DigestItemsWaiting(t testing.TB, js jetstream.JetStream, channel string) int {
	t.Helper()
	n := 0
	for _, d := range DigestEntries(t, js, channel) {
		if d.State == "open" {
			n += len(d.Items)
		}
	}
	return n
}
