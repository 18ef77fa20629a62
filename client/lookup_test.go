package client

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// BenchmarkLookupRecipient measures a lookup in an index of 200,000
// entries of 20,000 recipients (ten each): it reads the recipient's
// subject only, so its cost follows the recipient's entries, not the
// index's size.
func BenchmarkLookupRecipient(b *testing.B) {
	ts := topologytest.Start(b)
	ctx := b.Context()
	const recipients, each = 20_000, 10
	for i := range recipients * each {
		to := fmt.Sprintf("user-%05d", i%recipients)
		data, _ := json.Marshal(contract.LookupEntry{TaskID: fmt.Sprintf("t%d", i/recipients), To: to, Account: "hook",
			Kind: contract.EventSent, At: time.Now()})
		if _, err := ts.JS.PublishAsync(contract.LookupSubject(contract.RecipientHash(to)), data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-ts.JS.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("index not written")
	}
	b.ResetTimer()
	for i := range b.N {
		got, err := LookupRecipient(ctx, ts.JS, fmt.Sprintf("user-%05d", (i*7919)%recipients))
		require.NoError(b, err)
		require.Len(b, got.Entries, each)
	}
}
