package status_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// TestFoldReplaysAPreviousHoldersEventsInStreamOrder: a fold holder is
// handed a dead letter's re-queue event and dies before acknowledging it;
// the re-queued job's new failure is published after. The next holder
// folds both in stream order, so the recipient ends failed and the task
// final. Pulling on from the consumer folded the failure first (a failed
// recipient stays failed) and the re-queue event after the ack wait,
// leaving the recipient retrying for good (scenario seed 595946141).
func TestFoldReplaysAPreviousHoldersEventsInStreamOrder(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const task = "replay"
	publish := func(ev contract.Event) { t.Helper(); publishEvent(ctx, t, ts, task, ev) }
	stream, err := ts.JS.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	settled := func(want func(*contract.Progress) bool) func() bool {
		return func() bool {
			info, err := stream.Info(ctx)
			if err != nil {
				return false
			}
			c, err := stream.Consumer(ctx, contract.ConsumerStatus)
			if err != nil || c.CachedInfo().AckFloor.Stream != info.State.LastSeq {
				return false
			}
			p := ts.Progress(t, task)
			return p != nil && want(p)
		}
	}

	publish(contract.Event{Kind: contract.EventAccepted, Index: -1, Total: 1, State: contract.StateProcessing})
	publish(contract.Event{JobID: task + ".0", Kind: contract.EventFailed, Index: 0, Attempt: 1, Class: contract.ClassPermanent})
	runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, settled(func(p *contract.Progress) bool {
		return p.State.Final() && p.Failed == 1
	}))

	// The holder that dies: handed the re-queue event, never acknowledging it.
	publish(contract.Event{JobID: task + ".0", Kind: contract.EventRetrying, Index: 0, Requeued: true, Code: "retry_dead"})
	cons, err := stream.Consumer(ctx, contract.ConsumerStatus)
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	n := 0
	for m := range batch.Messages() {
		require.Contains(t, m.Subject(), string(contract.EventRetrying))
		n++
	}
	require.Equal(t, 1, n, "the dying holder was handed the re-queue event")
	publish(contract.Event{JobID: task + ".0", Kind: contract.EventFailed, Index: 0, Attempt: 1, Generation: 1, Class: contract.ClassPermanent})

	var last *contract.Progress
	runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, settled(func(p *contract.Progress) bool {
		last = p
		return p.State.Final() && p.Failed == 1 && p.Retrying == 0
	}))
	t.Logf("after the take-over: %s failed=%d retrying=%d", last.State, last.Failed, last.Retrying)
}

// TestProgressLostAfterItsCheckpointIsWrittenAgain: the last progress
// write of a task is lost after its checkpoint was stored (a nats-server
// killed before its write cache reached the file, or the status process
// killed between the two writes) and every event is acknowledged, so the
// stored progress is the one written before. The next holder of the fold
// finds the checkpoint saved after it and writes progress again; before,
// nothing marked the task dirty and progress stayed behind for good
// (scenario seed 840142194, twice: a task left unfinished at 88 sent of
// 90, and a task reopened by retry-dead left finished with the recipient
// it then sent counted failed).
func TestProgressLostAfterItsCheckpointIsWrittenAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		before, add []contract.Event
		final       func(p *contract.Progress) bool
	}{{
		name: "unfinished",
		before: []contract.Event{
			{Kind: contract.EventAccepted, Index: -1, Total: 2, State: contract.StateProcessing},
			{JobID: ".0", Kind: contract.EventSent, Index: 0, Attempt: 1},
		},
		add: []contract.Event{
			{JobID: ".1", Kind: contract.EventFailed, Index: 1, Attempt: 1, Class: contract.ClassPermanent},
		},
		final: func(p *contract.Progress) bool {
			return p.State == contract.StatePartial && p.Sent == 1 && p.Failed == 1 && p.FinishedAt != nil
		},
	}, {
		name: "reopened by retry-dead",
		before: []contract.Event{
			{Kind: contract.EventAccepted, Index: -1, Total: 2, State: contract.StateProcessing},
			{JobID: ".0", Kind: contract.EventSent, Index: 0, Attempt: 1},
			{JobID: ".1", Kind: contract.EventFailed, Index: 1, Attempt: 1, Class: contract.ClassPermanent},
		},
		add: []contract.Event{
			{JobID: ".1", Kind: contract.EventRetrying, Index: 1, Attempt: 1, Requeued: true},
			{JobID: ".1", Kind: contract.EventSent, Index: 1, Attempt: 2},
		},
		final: func(p *contract.Progress) bool {
			return p.State == contract.StateSucceeded && p.Sent == 2 && p.Failed == 0 && p.FinishedAt != nil
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := pipelinetest.Start(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const task = "lostwrite"
			publish := func(evs []contract.Event) {
				for _, ev := range evs {
					if ev.JobID != "" {
						ev.JobID = task + ev.JobID
					}
					publishEvent(ctx, t, ts, task, ev)
				}
			}
			publish(tc.before)
			n := len(tc.before) - 1
			runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, func() bool {
				p := ts.Progress(t, task)
				return p != nil && p.Done() == n
			})
			before := *ts.Progress(t, task)
			publish(tc.add)
			runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, func() bool {
				p := ts.Progress(t, task)
				return p != nil && tc.final(p)
			})

			// What a lost write leaves: the progress written before it is
			// the stored one again (a KV stream's messages cannot be
			// deleted, so it is written again, with its own updated_at).
			data, err := json.Marshal(before)
			require.NoError(t, err)
			kv, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
			require.NoError(t, err)
			_, err = kv.Put(ctx, task, data)
			require.NoError(t, err)

			runStatusUntil(t, ts, status.Config{Logger: logtest.Logger()}, func() bool {
				p := ts.Progress(t, task)
				return p != nil && tc.final(p)
			})
		})
	}
}

// publishEvent publishes ev as task's, stamped now, as dispatch would
// (a recipient's event names a recipient and an account).
func publishEvent(ctx context.Context, t *testing.T, ts *pipelinetest.Server, task string, ev contract.Event) {
	t.Helper()
	ev.TaskID, ev.At = task, time.Now().UTC()
	if ev.JobID != "" {
		ev.To, ev.Account = "+15550000000", "a"
	}
	data, err := contract.EncodeEvent(&ev)
	require.NoError(t, err)
	_, err = ts.JS.Publish(ctx, contract.EventSubject(task, ev.Kind), data, jetstream.WithMsgID(ev.MsgID()))
	require.NoError(t, err)
}
