package dispatch

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// These tests play a dispatch process killed between publishing a job's
// copy (parked, moved) and acknowledging the original: the first delivery
// is handled by hand up to the copy and never acknowledged, and the
// redelivery, 2 s later (the lanes' ack wait), is handled again.

// handoffRig is a dispatch service's state without its consume loops, and
// one account runner for "a"; "b" is a second healthy account.
type handoffRig struct {
	js   jetstream.JetStream
	svc  *Service
	r    *accountRunner
	cons jetstream.Consumer
}

const handoffAcct = `{"channel":"sandbox","rate_per_sec":1000,"burst":50,"concurrency":4}`

func newHandoffRig(t *testing.T) *handoffRig {
	t.Helper()
	js := topologytest.Start(t).JS
	ctx := t.Context()
	putAccounts(t, js, map[string]string{"a": handoffAcct, "b": handoffAcct})
	s, err := New(js, Config{})
	require.NoError(t, err)
	s.ctx = ctx
	for name, dst := range map[string]*jetstream.KeyValue{contract.BucketLedger: &s.ledger, contract.BucketTasks: &s.tasks, contract.BucketHealth: &s.healthKV} {
		*dst, err = js.KeyValue(ctx, name)
		require.NoError(t, err)
	}
	s.jobs, err = js.Stream(ctx, contract.StreamJobs)
	require.NoError(t, err)
	s.controls, err = shared.WatchControl(ctx, js, s.log, nil)
	require.NoError(t, err)
	s.health, err = shared.WatchHealth(ctx, js, s.log)
	require.NoError(t, err)
	s.accounts, err = shared.WatchAccounts(ctx, js, s.log, nil)
	require.NoError(t, err)
	var a contract.Account
	require.NoError(t, json.Unmarshal([]byte(handoffAcct), &a))
	a.Name = "a"
	r := newAccountRunner(ctx, s, &a, nil)
	cons, err := js.CreateOrUpdateConsumer(ctx, contract.StreamJobs, consumerConfig(&a, contract.PriorityNormal))
	require.NoError(t, err)
	return &handoffRig{js: js, svc: s, r: r, cons: cons}
}

// setControl stores the task's run state and waits until the service sees it.
func (g *handoffRig) setControl(t *testing.T, task string, state contract.TaskState) {
	t.Helper()
	kv, err := g.js.KeyValue(t.Context(), contract.BucketControl)
	require.NoError(t, err)
	data, _ := json.Marshal(contract.Control{State: state, At: time.Now().UTC()})
	_, err = kv.Put(t.Context(), task, data)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return g.svc.controls.Get(task).State == state }, 5*time.Second, 10*time.Millisecond)
}

// taken is a delivery with its message.
type taken struct {
	*delivery
	msg jetstream.Msg
}

// next fetches the next delivery of account a's normal lane.
func (g *handoffRig) next(t *testing.T) taken {
	t.Helper()
	batch, err := g.cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	require.NotNil(t, msg, "a delivery within 5 s")
	meta, err := msg.Metadata()
	require.NoError(t, err)
	d, err := g.r.receive(msg, meta, 0, nil)
	require.NoError(t, err)
	return taken{d, msg}
}

// count is how many messages JOBS holds on subject.
func (g *handoffRig) count(t *testing.T, subject string) uint64 {
	t.Helper()
	stream, err := g.js.Stream(t.Context(), contract.StreamJobs)
	require.NoError(t, err)
	info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// forgetDuplicatesSoon shortens JOBS's duplicate window to 100 ms, as a
// server restart forgets the ids of messages no longer stored, and returns
// the stream.
func (g *handoffRig) forgetDuplicatesSoon(t *testing.T) jetstream.Stream {
	t.Helper()
	stream, err := g.js.Stream(t.Context(), contract.StreamJobs)
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	cfg.Duplicates = 100 * time.Millisecond
	_, err = g.js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	return stream
}

// The steps of handle the tests call.
func (g *handoffRig) sentBefore(t *testing.T, d taken) bool {
	done, err := g.r.sentBefore(t.Context(), d.delivery)
	require.NoError(t, err)
	return done
}

func (g *handoffRig) mayStillSend(t *testing.T, d taken) bool {
	done, err := g.r.mayStillSend(t.Context(), d.delivery)
	require.NoError(t, err)
	return done
}

// TestParkedCopyIsNotRepeatedAfterACrash: the original of a parked job comes
// back after a crash before its ack. Still paused, it parks again: the
// stream must drop that second copy (it had no Nats-Msg-Id, so unparking
// re-queued both, and both could send). Resumed meanwhile, it must not be
// sent: its parked copy is live and is sent once unparked.
func TestParkedCopyIsNotRepeatedAfterACrash(t *testing.T) {
	g := newHandoffRig(t)
	const task = "parkcrash"
	g.setControl(t, task, contract.StatePaused)
	queueJobs(t, g.js, task, "a", 1)
	parked := contract.ParkedSubject(task, "a")

	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.True(t, g.mayStillSend(t, d), "parked")
	require.EqualValues(t, 1, g.count(t, parked))
	// Killed here: no ack. The redelivery, still paused, parks again.
	d = g.next(t)
	require.EqualValues(t, 2, d.delivered)
	if !g.sentBefore(t, d) {
		require.True(t, g.mayStillSend(t, d), "parked")
	}
	require.NoError(t, d.msgAck(t))
	require.EqualValues(t, 1, g.count(t, parked), "one parked copy after the redelivery")

	// Unparked, the copy is delivered, and parks once more (paused again):
	// a second park after an unpark is a new copy and must be stored.
	g.svc.unpark(t.Context(), task)
	require.EqualValues(t, 0, g.count(t, parked))
	d = g.next(t)
	require.True(t, d.job.Recheck)
	require.NotEmpty(t, d.copyOf, "the unparked copy still names its record")
	require.False(t, g.sentBefore(t, d))
	require.NotNil(t, d.entry.handoffNamed(d.copyOf))
	require.Equal(t, d.seq, d.entry.handoffNamed(d.copyOf).Claimed, "and claims it")
	require.True(t, g.mayStillSend(t, d), "parked again")
	require.NoError(t, d.msgAck(t))
	require.EqualValues(t, 1, g.count(t, parked), "the second park is stored")
}

// TestParkedOriginalIsNotSentAfterResume: the task resumes before the
// original of a parked job comes back after a crash; the original must not
// be sent beside its parked copy.
func TestParkedOriginalIsNotSentAfterResume(t *testing.T) {
	g := newHandoffRig(t)
	const task = "parkresume"
	g.setControl(t, task, contract.StatePaused)
	queueJobs(t, g.js, task, "a", 1)
	parked := contract.ParkedSubject(task, "a")

	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.True(t, g.mayStillSend(t, d), "parked")
	g.setControl(t, task, contract.StateProcessing)
	d = g.next(t) // the redelivery after the crash
	handled := g.sentBefore(t, d) || g.mayStillSend(t, d)
	require.True(t, handled, "the original is not sent: its parked copy is live")
	require.EqualValues(t, 1, g.count(t, parked))
}

// TestMovedOriginalIsNotSentAfterUnpause: a job moved off a paused account
// comes back there after a crash before its ack, the account edited out of
// its pause meanwhile: it must not be sent beside its moved copy, and,
// still paused, it must not move a second copy.
func TestMovedOriginalIsNotSentAfterUnpause(t *testing.T) {
	g := newHandoffRig(t)
	const task = "movecrash"
	queueJobs(t, g.js, task, "a", 2)
	toB := contract.JobSubject("b", contract.PriorityNormal)
	g.r.paused, g.r.pauseReason = true, "test"

	// Job 0: moved; the redelivery finds a still paused.
	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.True(t, g.mayStillSend(t, d), "moved")
	require.EqualValues(t, 1, g.count(t, toB))
	// Job 1: moved; the redelivery finds a unpaused.
	d1 := g.next(t)
	require.False(t, g.sentBefore(t, d1))
	require.True(t, g.mayStillSend(t, d1), "moved")
	require.EqualValues(t, 2, g.count(t, toB))

	d = g.next(t)
	require.Equal(t, 0, d.job.Index)
	if !g.sentBefore(t, d) {
		require.True(t, g.mayStillSend(t, d), "moved")
	}
	require.NoError(t, d.msgAck(t))
	require.EqualValues(t, 2, g.count(t, toB), "no second copy of job 0 on b")

	g.r.paused = false
	d1 = g.next(t)
	require.Equal(t, 1, d1.job.Index)
	handled := g.sentBefore(t, d1) || g.mayStillSend(t, d1)
	require.True(t, handled, "job 1 is not sent on a: its copy on b is live")
	require.EqualValues(t, 2, g.count(t, toB))
}

// msgAck acknowledges the delivery's message.
func (d taken) msgAck(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return d.msg.DoubleAck(ctx)
}

// TestDelayedOriginalIsNotSentAfterACrash: a job re-published to wait (a
// scheduled message) whose original comes back after a crash before its
// ack must not be sent at once beside its scheduled copy, nor schedule a
// second one: its copy comes back when due, once.
func TestDelayedOriginalIsNotSentAfterACrash(t *testing.T) {
	g := newHandoffRig(t)
	const task = "delaycrash"
	queueJobs(t, g.js, task, "a", 1)
	lane := contract.JobSubject("a", contract.PriorityNormal)

	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.NoError(t, g.delay(t, d, 3*time.Second))
	d = g.next(t) // the redelivery after the crash, before the copy is due
	handled := g.sentBefore(t, d) || g.mayStillSend(t, d)
	require.True(t, handled, "the original is not sent: its scheduled copy is live")
	require.NoError(t, d.msgAck(t))
	require.Eventually(t, func() bool { return g.count(t, lane) > 0 }, 10*time.Second, 50*time.Millisecond, "the copy comes back")
	time.Sleep(2 * time.Second)
	require.EqualValues(t, 1, g.count(t, lane), "one copy comes back")
}

func (g *handoffRig) delay(t *testing.T, d taken, wait time.Duration) error {
	return g.r.delayJob(t.Context(), d.delivery, "a", d.attempt-1, wait)
}

// TestGivenUpJobIsNotSentAfterACrash: a job given up on (a permanent error)
// whose process was killed before its dead letter or its termination was
// stored comes back: it must be given up again, not sent past its last
// attempt as a redelivery without an outcome.
func TestGivenUpJobIsNotSentAfterACrash(t *testing.T) {
	g := newHandoffRig(t)
	job := contract.Job{ID: contract.JobID("gu", 0, false), TaskID: "gu", Index: 0, To: "user-0", Body: "hi",
		Channel: "sandbox", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 3}
	data, err := json.Marshal(&job)
	require.NoError(t, err)
	_, err = g.js.Publish(t.Context(), contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)

	first := g.next(t)
	require.False(t, g.sentBefore(t, first))
	err = g.r.settle(t.Context(), first.delivery, &sendOutcome{res: channels.Result{Code: "400", Class: contract.ClassPermanent, Err: "bad recipient"}})
	require.True(t, shared.IsPermanent(err), "the first delivery gives up: %v", err)
	// Killed here: neither the dead letter nor the termination happened.

	again := g.next(t)
	require.True(t, again.redelivered)
	done, err := g.r.sentBefore(t.Context(), again.delivery)
	require.True(t, done, "the redelivery is not sent")
	var gu *giveUp
	require.ErrorAs(t, err, &gu, "it gives up again")
	require.True(t, shared.IsPermanent(err))
	require.Equal(t, 1, gu.attempt, "with the attempt that gave up")
	require.Equal(t, "400", gu.code)

	// A re-queued dead letter (a new generation) is sent again.
	next := job
	next.Generation, next.Recheck = 1, true
	data, err = json.Marshal(&next)
	require.NoError(t, err)
	_, err = g.js.Publish(t.Context(), contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)
	require.NoError(t, again.msg.Term())
	requeued := g.next(t)
	require.Equal(t, 1, requeued.job.Generation)
	require.False(t, g.sentBefore(t, requeued), "a new generation may send")
}

// TestCopyPublishedAgainAfterTheWindowIsDropped: a delayed job's original
// comes back after its copy was published, and the stream no longer knows
// the copy's Nats-Msg-Id (a server restart rebuilds the duplicate window
// from the messages still stored; here the window is shortened instead).
// A copy published again must not be sent as well (multi-process scenario
// seed 583131964 sent such jobs twice), and one already delivered is not
// published again: its schedule subject may hold the job's next copy by
// then, whose schedule it would replace (seed 15166146 lost such jobs).
func TestCopyPublishedAgainAfterTheWindowIsDropped(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	stream := g.forgetDuplicatesSoon(t)
	queueJobs(t, g.js, "againcopy", "a", 1)

	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.NoError(t, g.delay(t, d, time.Second)) // never acknowledged: a crash
	copies, sends, originals := 0, 0, 0
	var firstCopy uint64
	for copies < 1 || originals < 1 {
		d := g.next(t)
		if d.copyOf == "" {
			originals++
			require.True(t, g.sentBefore(t, d), "the original comes back and does not send")
			require.NoError(t, d.msgAck(t))
			continue
		}
		copies++
		if copies == 1 {
			firstCopy = d.seq
		}
		if !g.sentBefore(t, d) {
			sends++
		}
		require.NoError(t, d.msgAck(t))
	}
	// A copy the original published again before the first was delivered
	// replaced its schedule (the same subject); none comes after one was.
	time.Sleep(2500 * time.Millisecond)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "no copy or schedule is left")
	require.Equal(t, 1, sends, "the copy is the job")
	le, err := g.svc.readLedger(ctx, &d.job)
	require.NoError(t, err)
	require.Len(t, le.Handoffs, 1)
	require.Equal(t, firstCopy, le.Handoffs[0].Claimed, "the copy delivered first claimed the record")

	// A second copy that comes anyway (published again while the first
	// was not yet claimed) finds the record claimed and is not sent.
	require.NoError(t, g.svc.republishCopy(ctx, &le.Handoffs[0], le.Handoffs[0].copyOf(d.job)))
	again := g.next(t)
	require.Equal(t, le.Handoffs[0].MsgID, again.copyOf)
	require.True(t, g.sentBefore(t, again), "a second copy is not sent")
	require.NoError(t, again.msgAck(t))
	le, err = g.svc.readLedger(ctx, &d.job)
	require.NoError(t, err)
	require.Equal(t, firstCopy, le.Handoffs[0].Claimed, "the first copy keeps its claim")

	// A second copy handed back unbegun at its session's end leaves the
	// entry as the first copy's delivery left it.
	before := le.Seq
	second := &delivery{job: d.job, seq: firstCopy + 100, delivered: 1, copyOf: le.Handoffs[0].MsgID, entry: le}
	g.r.noteLeftUnsent(second)
	after, err := g.svc.readLedger(ctx, &d.job)
	require.NoError(t, err)
	require.Equal(t, before, after.Seq, "the entry still names the first copy's delivery")
}

// TestCopyPublishedAgainMidClaimKeepsTheNextCopy: a delayed job's original
// comes back and reads its ledger entry while the copy is unclaimed; before
// it publishes the copy again, the copy fires, is claimed and is delayed
// again, its next copy's schedule on the same subject. The publish must not
// replace that schedule: the first copy would fire a second time, be
// dropped as claimed, and the job would have no outcome (the window left
// after seed 15166146's fix). The duplicate window no longer knows the
// copy, as after a server restart.
func TestCopyPublishedAgainMidClaimKeepsTheNextCopy(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	stream := g.forgetDuplicatesSoon(t)
	queueJobs(t, g.js, "midclaim", "a", 1)

	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	require.NoError(t, g.delay(t, d, time.Second))
	stale, err := g.svc.readLedger(ctx, &d.job) // the original's read, before the claim
	require.NoError(t, err)
	h := stale.handedOff(d.seq)
	require.NotNil(t, h)
	require.Zero(t, h.Claimed)
	require.NoError(t, d.msgAck(t))

	first := g.next(t)
	require.Equal(t, h.MsgID, first.copyOf)
	require.False(t, g.sentBefore(t, first), "the first copy claims the record and goes on")
	require.NoError(t, g.delay(t, first, 2*time.Second))
	require.NoError(t, first.msgAck(t))

	require.NoError(t, g.svc.republishCopy(ctx, h, h.copyOf(d.job)), "a copy waiting counts as published")
	next := g.next(t)
	require.NotEqual(t, h.MsgID, next.copyOf, "the first copy did not come again")
	le, err := g.svc.readLedger(ctx, &d.job)
	require.NoError(t, err)
	require.Equal(t, le.handedOff(first.seq).MsgID, next.copyOf, "the next copy came")
	require.False(t, g.sentBefore(t, next), "the next copy is the job")
	require.NoError(t, next.msgAck(t))
	time.Sleep(1500 * time.Millisecond)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "no copy or schedule is left")
}
