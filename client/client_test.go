package client

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
)

// TestTaskID: the id is found wherever it stands among the top-level keys
// (matched like encoding/json, ignoring case), and never inside a nested
// object; anything unreadable has none.
func TestTaskID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"t1","recipients":["a"]}`:                      "t1",
		`{"recipients":[{"to":"a","id":"nested"}],"id":"t2"}`: "t2",
		`{"vars":{"id":"nested"},"ID":"t3"}`:                  "t3",
		`  {"channel":"webhook"}`:                             "",
		`{"id":7}`:                                            "",
		`{"id":`:                                              "",
		`["id","t4"]`:                                         "",
		``:                                                    "",
		`{"template":"{{.id}}","id":"t5","recipients":[1,2,3]} x`: "t5",
	} {
		require.Equal(t, want, taskID([]byte(in)), in)
	}
}

// TestControlWaitsForAResponder: a control request sent while nobody
// answers the subject (ingest reconnecting after a server restart) is sent
// again until a responder answers it, exactly once; with none it gives up
// when its context ends, saying there were no responders.
func TestControlWaitsForAResponder(t *testing.T) {
	ts := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := Control(ctx, ts.NC, "t-none", "pause")
	cancel()
	require.ErrorIs(t, err, nats.ErrNoResponders)

	var answered atomic.Int32
	go func() {
		time.Sleep(700 * time.Millisecond)
		nc, _ := ts.ConnectAs(t, natstest.Credentials{})
		_, err := nc.Subscribe(contract.ControlSubject("t1"), func(m *nats.Msg) {
			answered.Add(1)
			rep, _ := json.Marshal(contract.ControlReply{OK: true, State: contract.StatePaused})
			_ = m.Respond(rep)
		})
		assert.NoError(t, err)
		assert.NoError(t, nc.Flush())
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	rep, err := Control(ctx, ts.NC, "t1", "pause")
	require.NoError(t, err)
	require.Equal(t, contract.StatePaused, rep.State)
	require.EqualValues(t, 1, answered.Load(), "the request is answered once")
	require.Greater(t, time.Since(start), 600*time.Millisecond, "it waited for the responder")
}
