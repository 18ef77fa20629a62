package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestEveryGiveUpHasAnEventAndADeadLetter: the give-ups that used to leave
// no trace each leave an event for the recipient and a dead letter:
// a render batch whose task has no record (a bare Term before), a job that
// does not decode, a parked job that does not decode (dropped by unpark
// before), and retry-dead keeps the letters it cannot re-send (purged
// before).
func TestEveryGiveUpHasAnEventAndADeadLetter(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "gu", harness.WebhookAccount(gw.URL, `"rate_per_sec":100,"burst":10,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	publish := func(subject, data string) {
		_, err := ts.JS.Publish(ctx, subject, []byte(data))
		require.NoError(t, err)
	}
	kinds := func(task string) map[contract.EventKind]int { return harness.CountByKind(ts.Events(t, task)) }

	// A render batch of a task without a record.
	b, _ := json.Marshal(contract.RenderBatch{TaskID: "ghost", First: 0, Recipients: []contract.BatchRecipient{{To: "a"}, {To: "b"}}})
	publish(contract.RenderSubject("ghost"), string(b))
	// A job with a field of the wrong type.
	publish(contract.JobSubject("gu", contract.PriorityNormal), `{"id":"ghost2.0","task_id":"ghost2","index":0,"to":"x","max_attempts":"five"}`)
	// A parked job likewise, then unparked.
	publish(contract.ParkedSubject("ghost3", "gu"), `{"id":"ghost3.0","task_id":"ghost3","index":0,"to":"y","attempts":"x"}`)
	natstest.Eventually(t, 10*time.Second, func() bool {
		data, _ := json.Marshal(contract.RequeueRequest{Action: contract.RequeueParked})
		_, err := ts.NC.Request(contract.RequeueSubject("ghost3"), data, 2*time.Second)
		return err == nil && len(harness.DeadLetters(t, ts, "ghost3")) == 1
	}, "the parked job is dead-lettered")

	defer func() {
		if t.Failed() {
			for _, task := range []string{"ghost", "ghost2", "ghost3"} {
				t.Logf("%s: events %v, %d dead letters", task, kinds(task), len(harness.DeadLetters(t, ts, task)))
			}
		}
	}()
	natstest.Eventually(t, 20*time.Second, func() bool {
		return kinds("ghost")[contract.EventSkipped] == 2 && kinds("ghost2")[contract.EventFailed] == 1 &&
			kinds("ghost3")[contract.EventFailed] == 1 && len(harness.DeadLetters(t, ts, "ghost")) == 1 && len(harness.DeadLetters(t, ts, "ghost2")) == 1
	}, "every give-up has its events and its dead letter")
	for _, task := range []string{"ghost", "ghost2", "ghost3"} {
		d := harness.DeadLetters(t, ts, task)
		t.Logf("%s: events %v; dead letter %q", task, kinds(task), d[0].Error[:min(len(d[0].Error), 120)])
	}

	// retry-dead has nothing to re-send in those letters and keeps them.
	data, _ := json.Marshal(contract.RequeueRequest{Action: contract.RequeueDead})
	m, err := ts.NC.Request(contract.RequeueSubject("ghost"), data, 10*time.Second)
	require.NoError(t, err)
	var reply contract.RequeueReply
	require.NoError(t, json.Unmarshal(m.Data, &reply))
	require.True(t, reply.OK, reply.Error)
	require.Zero(t, reply.Requeued)
	require.Len(t, harness.DeadLetters(t, ts, "ghost"), 1, "retry-dead keeps the letter it could not re-send")
	require.Zero(t, gw.Ledger().Requests, "nothing was sent")
}
