package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/ingest"
)

// TestControlPauseWhileRetryDeadRuns: a retry-dead that takes 4 s (here a
// stand-in for dispatch that answers the re-queue request slowly) does not
// hold up a pause of the same task: control requests are served
// concurrently, so the pause is answered within a second.
func TestControlPauseWhileRetryDeadRuns(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "sb", `{"channel":"sandbox","rate_per_sec":10}`)
	ing, err := ingest.New(ts.JS, ingest.Config{Logger: logtest.Logger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ing.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const slow = 4 * time.Second
	sub, err := ts.NC.QueueSubscribe(contract.SubjectRequeuePrefix+"*", "dispatch", func(m *nats.Msg) {
		var req contract.RequeueRequest
		_ = json.Unmarshal(m.Data, &req)
		if req.Action == contract.RequeueDead {
			go func() {
				time.Sleep(slow)
				data, _ := json.Marshal(contract.RequeueReply{OK: true, Requeued: 7})
				_ = m.Respond(data)
			}()
			return
		}
		data, _ := json.Marshal(contract.RequeueReply{OK: true})
		_ = m.Respond(data)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	task := contract.Task{ID: "ctlconc", Channel: "sandbox", Template: "hi", Recipients: pipelinetest.Recipients("c", 3)}
	harness.Submit(t, ts, task)
	natstest.Eventually(t, 10*time.Second, func() bool {
		_, err := harness.KVGet(t, ts, contract.BucketTasks, task.ID)
		return err == nil
	}, "task recorded")

	retried := make(chan *contract.ControlReply, 1)
	go func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer rcancel()
		r, err := client.Control(rctx, ts.NC, task.ID, contract.ActionRetryDead)
		if err != nil {
			r = &contract.ControlReply{Error: err.Error()}
		}
		retried <- r
	}()
	time.Sleep(200 * time.Millisecond) // the retry-dead is under way
	start := time.Now()
	r := harness.Control(t, ts, task.ID, contract.ActionPause)
	pauseTook := time.Since(start)
	rd := <-retried
	t.Logf("pause answered %s after it was sent, while a %s retry-dead ran (retry-dead: ok=%v requeued=%d, %s after the pause)",
		pauseTook.Round(time.Millisecond), slow, rd.OK, rd.Requeued, time.Since(start).Round(time.Millisecond))
	require.True(t, r.OK, r.Error)
	require.Equal(t, contract.StatePaused, r.State)
	require.Less(t, pauseTook, time.Second, "pause within a second while a retry-dead runs")
	require.True(t, rd.OK, rd.Error)
	require.Equal(t, 7, rd.Requeued)
}
