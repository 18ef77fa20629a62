package dispatch

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/shared"
)

// TestDispatchLedgerSkipsSentJob publishes jobs straight onto an account's
// queue, as a resumed expansion or a re-publication would: one whose ledger
// entry says sent (its event was never stored), one whose sent event is
// already stored, and a fresh one. Dispatch sends only the fresh one; it
// records the first one's sent event from the ledger and adds no second
// event for the second. A successful send writes no ledger entry: its
// stored sent event is the record.
func TestDispatchLedgerSkipsSentJob(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	gw, rec := harness.StartRecordedGateway(t, gateway.Config{Seed: 1}, 0)
	ts.PutAccount(t, "idem", harness.WebhookAccount(rec.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ledger, err := ts.JS.KeyValue(ctx, contract.BucketLedger)
	require.NoError(t, err)
	const taskID = "idem-task"
	jobs := make([]contract.Job, 3)
	for i := range jobs {
		jobs[i] = contract.Job{ID: contract.JobID(taskID, i, false), TaskID: taskID, Index: i, To: "r" + string(rune('0'+i)), Body: "hello",
			Channel: "webhook", Account: "idem", Priority: contract.PriorityNormal, MaxAttempts: 5, EnqueuedAt: time.Now().UTC(),
			Recheck: i < 2}
	}
	_, err = ledger.Put(ctx, jobs[0].LedgerKey(), []byte(`{"state":"sent","account":"x","attempt":1}`))
	require.NoError(t, err)
	require.NoError(t, shared.PublishEvent(ctx, ts.JS, &contract.Event{TaskID: taskID, JobID: jobs[1].ID, To: jobs[1].To,
		Account: "y", Kind: contract.EventSent, Attempt: 1, Index: 1}))
	for _, j := range jobs {
		data, err := json.Marshal(j)
		require.NoError(t, err)
		_, err = ts.JS.Publish(ctx, contract.JobSubject("idem", contract.PriorityNormal), data)
		require.NoError(t, err)
	}

	var sent []contract.Event
	natstest.Eventually(t, 10*time.Second, func() bool {
		sent = harness.EventsOf(ts.Events(t, taskID), contract.EventSent)
		return len(sent) >= 3
	}, "a sent event for each job")
	cons, err := ts.JS.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer("idem", contract.PriorityNormal))
	require.NoError(t, err)
	natstest.Eventually(t, 5*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, "every job acknowledged")
	time.Sleep(200 * time.Millisecond)
	sent = harness.EventsOf(ts.Events(t, taskID), contract.EventSent)
	l := gw.Ledger()
	byJob := map[string][]contract.Event{}
	for _, e := range sent {
		byJob[e.JobID] = append(byJob[e.JobID], e)
	}
	t.Logf("provider requests: ledger said sent %d, event said sent %d, fresh %d; events %+v",
		l.RequestsByKey[jobs[0].ID], l.RequestsByKey[jobs[1].ID], l.RequestsByKey[jobs[2].ID], byJob)
	require.Zero(t, l.RequestsByKey[jobs[0].ID], "the job the ledger records as sent was not sent again")
	require.Zero(t, l.RequestsByKey[jobs[1].ID], "the job with a stored sent event was not sent again")
	require.Equal(t, 1, l.Requests, "only the fresh job reached the provider")
	require.Equal(t, 1, l.RequestsByKey[jobs[2].ID])
	require.Len(t, sent, 3, "one sent event per job")
	require.Equal(t, "x", byJob[jobs[0].ID][0].Account, "the event repeats the ledger's account")
	require.Equal(t, 1, byJob[jobs[0].ID][0].Attempt)
	require.Equal(t, "idem", byJob[jobs[2].ID][0].Account)

	_, err = ledger.Get(ctx, jobs[2].LedgerKey())
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a successful send writes no ledger entry")
}

// TestDispatchDeadLetterHistory: a recipient answered 503 twice and then
// 400 is given up on; its dead letter carries the job, the class, the code
// and every attempt's error.
func TestDispatchDeadLetterHistory(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	var mu sync.Mutex
	attempts := map[string]int{}
	rec := harness.StartRecorder(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ To string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		attempts[body.To]++
		n := attempts[body.To]
		mu.Unlock()
		switch {
		case body.To == "doomed" && n <= 2:
			http.Error(w, `{"error":"overloaded, try again"}`, http.StatusServiceUnavailable)
		case body.To == "doomed":
			http.Error(w, `{"error":"no such user"}`, http.StatusBadRequest)
		default:
			_, _ = w.Write([]byte(`{"id":"ok"}`))
		}
	}), 0)
	ts.PutAccount(t, "dl", harness.WebhookAccount(rec.URL, `"rate_per_sec":100,"burst":5,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, pipelinetest.PipelineConfig{Dispatch: dispatch.Config{BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	task := contract.Task{ID: "deadhist", Channel: "webhook", Template: "hi {{.to}}", MaxAttempts: 5,
		Recipients: []contract.Recipient{{To: "fine"}, {To: "doomed"}}}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 20*time.Second)
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, 1, p.Sent)
	require.Equal(t, 1, p.Failed)

	dead := harness.DeadLetters(t, ts, task.ID)
	require.Len(t, dead, 1)
	d := dead[0]
	t.Logf("dead letter: to %q attempts %d class %s code %s error %q account %s; history %+v", d.Job.To, d.Attempts, d.Class, d.Code, d.Error, d.Account, d.History)
	require.Equal(t, "doomed", d.Job.To)
	require.Equal(t, "hi doomed", d.Job.Body, "the job as it was enqueued")
	require.Equal(t, task.ID, d.Job.TaskID)
	require.Equal(t, 5, d.Job.MaxAttempts)
	require.Equal(t, "dl", d.Account)
	require.Equal(t, 3, d.Attempts)
	require.Equal(t, contract.ClassPermanent, d.Class)
	require.Equal(t, "400", d.Code)
	require.Contains(t, d.Error, "no such user")
	require.Len(t, d.History, 3, "every attempt's error")
	for i, h := range d.History {
		require.Equal(t, i+1, h.Attempt)
		require.Equal(t, "dl", h.Account)
		require.False(t, h.At.IsZero())
	}
	for _, h := range d.History[:2] {
		require.Equal(t, contract.ClassRetryable, h.Class)
		require.Equal(t, "503", h.Code)
		require.Contains(t, h.Error, "overloaded")
	}
	require.Equal(t, contract.ClassPermanent, d.History[2].Class)
	require.Equal(t, "400", d.History[2].Code)
	require.Contains(t, d.History[2].Error, "no such user")
	require.Equal(t, 3, attempts["doomed"])
}
