package ingest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// TestBatchesCutByBytes: recipients with large variables go in smaller
// batches that stay under the byte budget, none is lost or repeated, and
// a recipient whose variables exceed contract.MaxVarsBytes is marked invalid
// (render skips it with the reason) instead of making a job that cannot
// be published.
func TestBatchesCutByBytes(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("v", 40<<10)
	var rs []contract.Recipient
	for i := range 500 {
		rs = append(rs, contract.Recipient{To: "r" + strings.Repeat("0", 3) + string(rune('a'+i%26)) + strings.Repeat("z", i/26), Vars: map[string]any{"blob": big}})
	}
	rs = append(rs, contract.Recipient{To: "huge", Vars: map[string]any{"blob": strings.Repeat("h", contract.MaxVarsBytes)}})
	exp := expand(channels.Webhook{}, rs)
	require.Len(t, exp.recipients, 501)
	require.Contains(t, exp.recipients[500].Invalid, "vars: more than")
	require.Nil(t, exp.recipients[500].Vars)

	const budget = 1 << 20
	bs := batches("t", exp.recipients, 500, budget, false)
	next := 0
	for _, b := range bs {
		require.Equal(t, next, b.First, "batches are contiguous")
		size := 0
		for i := range b.Recipients {
			size += b.Recipients[i].BatchBytes()
		}
		require.LessOrEqual(t, size, budget)
		next += len(b.Recipients)
	}
	require.Equal(t, 501, next)
	t.Logf("501 recipients with 40 KiB of vars each: %d batches under %d bytes", len(bs), budget)
	require.Greater(t, len(bs), 20)
	require.Len(t, batches("t", exp.recipients[:10], 500, budget, false), 1, "small ones stay together")
}

// TestBatchSizeFor: the configured size, or 16 recipients an account of
// the pool when that is more, up to 16,000 however large the pool.
func TestBatchSizeFor(t *testing.T) {
	for _, c := range []struct{ configured, pool, want int }{
		{500, 0, 500}, {500, 3, 500}, {500, 31, 500}, {500, 32, 512},
		{500, 100, 1600}, {500, 1000, 16_000}, {500, 5000, 16_000}, {2000, 50, 2000},
	} {
		if got := BatchSizeFor(c.configured, c.pool); got != c.want {
			t.Errorf("BatchSizeFor(%d, %d) = %d, want %d", c.configured, c.pool, got, c.want)
		}
	}
}
