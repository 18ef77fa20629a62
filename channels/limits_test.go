package channels

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func TestEffectiveMaxBatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ch       Channel
		maxBatch int
		want     int
	}{
		{WxPusher{}, 1, 1},
		{WxPusher{}, 500, 500},
		{WxPusher{}, 5000, WxPusherMaxUIDs},
		{Sandbox{}, 250, 250},
		{Webhook{}, 100, 1}, // a loop of single sends is not a batch
		{WhatsApp{}, 100, 1},
		{SMTP{}, 100, 1},
	}
	for _, tt := range tests {
		got := EffectiveMaxBatch(tt.ch, &contract.Account{Channel: tt.ch.Name(), MaxBatch: tt.maxBatch})
		require.Equal(t, tt.want, got, "%s max_batch %d", tt.ch.Name(), tt.maxBatch)
	}
}

func TestEffectiveDailyCap(t *testing.T) {
	t.Parallel()
	require.Equal(t, 10000, EffectiveDailyCap(waAccount(t, "", `,"tier":"10k"`)))
	require.Equal(t, 500, EffectiveDailyCap(waAccount(t, "", `,"tier":"10k","daily_cap":500`)), "an explicit daily_cap wins")
	require.Equal(t, 0, EffectiveDailyCap(waAccount(t, "", "")))
	require.Equal(t, 0, EffectiveDailyCap(waAccount(t, "", `,"tier":"unlimited"`)))
	require.Equal(t, 0, EffectiveDailyCap(testAccount(t, `{"channel":"webhook","tier":"10k"}`)), "tier means nothing to other channels")
	require.Equal(t, 7, EffectiveDailyCap(testAccount(t, `{"channel":"webhook","daily_cap":7}`)))
}
