package shared

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestIndexPersistsAsyncOnASingleNodeOnly: LOOKUP is asynchronous on one
// node and not when replicated (the server refuses it there); a stream in
// place keeps its mode, which the server cannot change, and an
// asynchronous one that is to be replicated is an error naming the way
// out.
func TestIndexPersistsAsyncOnASingleNodeOnly(t *testing.T) {
	lookup := func(replicas int) jetstream.StreamConfig {
		for _, sc := range Streams(TopologyConfig{Replicas: replicas}) {
			if sc.Name == contract.StreamLookup {
				return sc
			}
		}
		t.Fatal("no LOOKUP")
		return jetstream.StreamConfig{}
	}
	require.Equal(t, jetstream.AsyncPersistMode, lookup(1).PersistMode)
	for _, sc := range Streams(TopologyConfig{Replicas: 3}) {
		require.Equal(t, jetstream.DefaultPersistMode, sc.PersistMode, sc.Name)
	}

	in := func(mode jetstream.PersistModeType) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: contract.StreamLookup, PersistMode: mode}}
	}
	for _, c := range []struct {
		want     jetstream.StreamConfig
		cur      *jetstream.StreamInfo
		mode     jetstream.PersistModeType
		mistaken bool
	}{
		{lookup(1), nil, jetstream.AsyncPersistMode, false},
		{lookup(3), nil, jetstream.DefaultPersistMode, false},
		{lookup(1), in(jetstream.DefaultPersistMode), jetstream.DefaultPersistMode, false}, // set up before the setting, or a cluster back to one replica
		{lookup(1), in(jetstream.AsyncPersistMode), jetstream.AsyncPersistMode, false},
		{lookup(3), in(jetstream.DefaultPersistMode), jetstream.DefaultPersistMode, false},
		{lookup(3), in(jetstream.AsyncPersistMode), 0, true}, // one node grown to a cluster
	} {
		mode, err := persistModeFor(c.want, c.cur)
		if c.mistaken {
			require.ErrorContains(t, err, "remove it (`nats stream rm LOOKUP`; what it holds is lost) and run setup again")
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.mode, mode)
	}
}
