package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// digestJob is a sandbox job of task to user-0 with digest key "news".
func digestJob(task string, window time.Duration) contract.Job {
	return contract.Job{ID: contract.JobID(task, 0, false), TaskID: task, To: "user-0", Body: "from " + task,
		Channel: "sandbox", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 3,
		DigestKey: "news", DigestWindow: contract.Duration(window)}
}

// TestDigestLeftSentIsFinished plays a dispatch killed after it recorded a
// digest as sent and before it published the items' sent events: the next
// job to that recipient and key publishes them (once each, also when the
// entry is found twice) and deletes the entry, then opens its own digest.
func TestDigestLeftSentIsFinished(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	ctx := t.Context()
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4}`})
	ledger, err := js.KeyValue(ctx, contract.BucketLedger)
	require.NoError(t, err)

	items := []contract.Job{digestJob("x", time.Second), digestJob("y", time.Second), digestJob("z", time.Second)}
	key := digestKey(&items[0])
	require.NotContains(t, key, "user-0", "recipients are hashed in keys")
	left := digestEntry{State: digestSent, Carrier: items[0].ID, Items: items, Account: "a", Attempt: 1, SentAt: time.Now().UTC()}
	data, err := json.Marshal(&left)
	require.NoError(t, err)
	_, err = ledger.Put(ctx, key, data)
	require.NoError(t, err)

	runService(t, js, Config{Logger: logtest.Logger()})
	next := digestJob("w", time.Second)
	data, err = json.Marshal(&next)
	require.NoError(t, err)
	_, err = js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)

	natstest.Eventually(t, 15*time.Second, func() bool { return sentOf(t, js, "w") == 1 }, "the next job's own digest sent")
	for _, task := range []string{"x", "y", "z"} {
		require.EqualValues(t, 1, sentOf(t, js, task), "sent events of %s", task)
	}
	// Found again (a second crash before the delete): no second event.
	data, err = json.Marshal(&left)
	require.NoError(t, err)
	_, err = ledger.Put(ctx, key, data)
	require.NoError(t, err)
	svc, err := New(js, Config{})
	require.NoError(t, err)
	svc.ledger = ledger
	e, rev, err := svc.readDigest(ctx, key)
	require.NoError(t, err)
	require.NoError(t, svc.finishDigest(ctx, key, e, rev))
	for _, task := range []string{"x", "y", "z"} {
		require.EqualValues(t, 1, sentOf(t, js, task), "sent events of %s after finishing twice", task)
	}
	_, err = ledger.Get(ctx, key)
	require.True(t, errors.Is(err, jetstream.ErrKeyNotFound), "finished entry deleted: %v", err)
	ev := lastSent(t, js, "y")
	require.Equal(t, items[0].ID, ev.CarriedBy)
	require.Equal(t, "a", ev.Account)
	own := lastSent(t, js, "w")
	require.Equal(t, own.JobID, own.CarriedBy, "the next job carried its own digest")
	require.Equal(t, 1, own.DigestSize)
}

// sentOf counts task's stored sent events.
func sentOf(t *testing.T, js jetstream.JetStream, task string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	subject := contract.EventSubject(task, contract.EventSent)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// lastSent is task's last stored sent event.
func lastSent(t *testing.T, js jetstream.JetStream, task string) contract.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, contract.StreamEvents)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx, contract.EventSubject(task, contract.EventSent))
	require.NoError(t, err)
	var ev contract.Event
	require.NoError(t, contract.DecodeEvent(m.Data, &ev))
	return ev
}

// TestDigestStepsRepeatNothingAfterACrash plays a dispatch killed after a
// job opened its digest (scheduling itself as the carrier) and after one
// joined it, each before its ack: the redeliveries schedule no second
// carrier and add no second item.
func TestDigestStepsRepeatNothingAfterACrash(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	publish := func(job contract.Job) {
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = g.js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data)
		require.NoError(t, err)
	}
	step := func(d taken) bool {
		if g.sentBefore(t, d) {
			return true
		}
		done, err := g.r.digest(ctx, d.delivery)
		require.NoError(t, err)
		return done
	}
	opener, joiner := digestJob("p", 30*time.Second), digestJob("q", 30*time.Second)
	carrierCopy := contract.SubjectDelayPrefix + "a." + opener.ID

	publish(opener)
	d := g.next(t)
	require.True(t, step(d), "opened its digest")
	require.EqualValues(t, 1, g.count(t, carrierCopy))
	// Killed here: no ack. The redelivery schedules the same copy again,
	// which the stream drops.
	d = g.next(t)
	require.EqualValues(t, 2, d.delivered)
	require.True(t, step(d))
	require.NoError(t, d.msgAck(t))
	require.EqualValues(t, 1, g.count(t, carrierCopy), "one carrier copy")

	publish(joiner)
	d = g.next(t)
	require.True(t, step(d), "joined")
	d = g.next(t)
	require.EqualValues(t, 2, d.delivered)
	require.True(t, step(d), "already joined")
	require.NoError(t, d.msgAck(t))

	e, _, err := g.svc.readDigest(ctx, digestKey(&opener))
	require.NoError(t, err)
	require.Equal(t, digestOpen, e.State)
	require.Equal(t, opener.ID, e.Carrier)
	require.Len(t, e.Items, 2)
	require.Equal(t, []string{"p.0", "q.0"}, []string{e.Items[0].ID, e.Items[1].ID})
}

func TestDigestWindowConfigNamesTheField(t *testing.T) {
	t.Parallel()
	err := (&Config{DigestWindow: 100 * time.Millisecond}).validate()
	require.EqualError(t, err, "DigestWindow (DISPATCH_DIGEST_WINDOW): must be between 1s and 24h0m0s, got 100ms")
	require.NoError(t, (&Config{DigestWindow: time.Minute}).validate())
}

// TestDigestItemTakenOutIsNotRepeatedAfterACrash plays a dispatch killed
// after a job joined a digest and before its ack, whose task is paused
// before the carrier is due: the carrier takes the item out as a job of
// its own, and the joined message's redelivery publishes no second copy.
func TestDigestItemTakenOutIsNotRepeatedAfterACrash(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	publish := func(job contract.Job) {
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		_, err = g.js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data)
		require.NoError(t, err)
	}
	digest := func(d taken) (bool, error) { return g.r.digest(ctx, d.delivery) }
	opener, joiner := digestJob("p", time.Second), digestJob("q", time.Second)

	publish(opener)
	d := g.next(t)
	require.False(t, g.sentBefore(t, d))
	done, err := digest(d)
	require.True(t, done)
	require.NoError(t, err)
	require.NoError(t, d.msgAck(t))
	publish(joiner)
	d = g.next(t)
	require.False(t, g.sentBefore(t, d))
	done, err = digest(d)
	require.True(t, done, "joined")
	require.NoError(t, err)
	// Killed here: the joiner's message is not acknowledged.
	g.setControl(t, "q", contract.StatePaused)

	// The carrier's copy comes when the window closes and takes q out;
	// the joiner's redelivery comes after the ack wait.
	var carried, redelivered bool
	copies := 0
	for !carried || !redelivered || copies == 0 {
		d := g.next(t)
		switch d.job.TaskID {
		case "p":
			require.False(t, g.sentBefore(t, d))
			done, err := digest(d)
			require.NoError(t, err)
			require.False(t, done, "the carrier goes on to send")
			require.NotNil(t, d.digest)
			require.Len(t, d.digest.entry.Items, 1, "q taken out")
			require.Equal(t, "p.0", d.digest.entry.Items[0].ID)
			carried = true
		case "q":
			if d.job.NoDigest {
				copies++
				break
			}
			require.EqualValues(t, 2, d.delivered, "the joined message's redelivery")
			require.True(t, g.sentBefore(t, d), "handed off as the taken-out copy: not sent")
			redelivered = true
		}
		require.NoError(t, d.msgAck(t))
	}
	// Nothing else arrives: the redelivery's copy was dropped.
	batch, err := g.cons.Fetch(1, jetstream.FetchMaxWait(2500*time.Millisecond))
	require.NoError(t, err)
	for m := range batch.Messages() {
		t.Fatalf("unexpected delivery: %s", m.Data())
	}
	require.Equal(t, 1, copies, "one copy of q taken out")
}

// TestDigestItemHeldByPolicyIsNotLost plays the carrier of a digest whose
// items the recipient policy holds (quiet hours set during the window)
// killed after the entry named the item it took out (Out) and after the
// item's copy was published, before the entry forgot it: the copy, which
// finds itself still named, waits instead of counting as joined (it was
// dropped, and the item lost, when it did); the carrier's copy, the policy
// holding it too, publishes the item again (the stream drops it), deletes
// the entry and goes on alone, free to merge again; the waiting copy comes
// back and, still held, does not join a digest. One copy of the item, none
// repeated.
func TestDigestItemHeldByPolicyIsNotLost(t *testing.T) {
	g := newHandoffRig(t)
	ctx := t.Context()
	var err error
	g.svc.policy, err = policy.Watch(ctx, g.js, g.svc.log)
	require.NoError(t, err)
	g.svc.frequency, err = policy.OpenCounter(ctx, g.js)
	require.NoError(t, err)
	publish := func(job contract.Job, msgID string) {
		data, err := json.Marshal(&job)
		require.NoError(t, err)
		var opts []jetstream.PublishOpt
		if msgID != "" {
			opts = append(opts, jetstream.WithMsgID(msgID))
		}
		_, err = g.js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data, opts...)
		require.NoError(t, err)
	}
	digest := func(d taken) bool {
		require.False(t, g.sentBefore(t, d))
		done, err := g.r.digest(ctx, d.delivery)
		require.NoError(t, err)
		return done
	}
	opener, joiner := digestJob("p", 30*time.Second), digestJob("q", 30*time.Second)
	publish(opener, "")
	d := g.next(t)
	require.True(t, digest(d), "opened")
	require.NoError(t, d.msgAck(t))
	publish(joiner, "")
	d = g.next(t)
	joinSeq := d.seq
	require.True(t, digest(d), "joined")
	require.NoError(t, d.msgAck(t))

	// Quiet hours now, for marketing, in UTC.
	now := time.Now().UTC()
	kv, err := g.js.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	_, err = kv.Put(ctx, contract.PolicyDefault, fmt.Appendf(nil, `{"quiet_hours":{"start":%q,"end":%q,"categories":["marketing"]}}`,
		now.Add(-2*time.Hour).Format("15:04"), now.Add(2*time.Hour).Format("15:04")))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return g.svc.policy.For("sandbox") != nil }, 5*time.Second, 10*time.Millisecond)

	// The carrier, due, named q in Out and published its copy; killed
	// before the entry forgot it.
	key := digestKey(&opener)
	e, rev, err := g.svc.readDigest(ctx, key)
	require.NoError(t, err)
	require.Len(t, e.Items, 2)
	e.Out, e.Items, e.ClosesAt = e.Items[1:], e.Items[:1], time.Now().Add(-time.Second)
	_, err = g.svc.updateDigest(ctx, key, e, rev)
	require.NoError(t, err)
	copyOfQ := e.Out[0]
	copyOfQ.Recheck = true
	outID := fmt.Sprintf("%s:digest-out:%d", copyOfQ.MsgID(), joinSeq)
	publish(copyOfQ, outID)
	d = g.next(t)
	require.Equal(t, "q", d.job.TaskID)
	require.True(t, digest(d), "still named in the entry: it waits")
	require.NoError(t, d.msgAck(t))
	require.EqualValues(t, 1, g.count(t, contract.SubjectDelayPrefix+"a."+joiner.ID), "q comes back in a second")

	// The carrier's copy (as its schedule would deliver it).
	carrier := opener
	carrier.DigestCarrier, carrier.Recheck = true, true
	publish(carrier, "")
	d = g.next(t)
	require.Equal(t, "p", d.job.TaskID)
	require.False(t, digest(d), "held by the policy: handed over, it goes on alone")
	require.Nil(t, d.digest)
	require.False(t, d.job.NoDigest, "free to merge again")
	require.False(t, d.job.DigestCarrier)
	require.NoError(t, d.msgAck(t))
	_, err = g.svc.ledger.Get(ctx, key)
	require.True(t, errors.Is(err, jetstream.ErrKeyNotFound), "no item left: entry deleted: %v", err)

	d = g.next(t)
	require.Equal(t, "q", d.job.TaskID, "q back from its wait")
	require.False(t, digest(d), "held by the policy: it does not join")
	require.False(t, d.job.NoDigest)
	require.NoError(t, d.msgAck(t))
	batch, err := g.cons.Fetch(1, jetstream.FetchMaxWait(2500*time.Millisecond))
	require.NoError(t, err)
	for m := range batch.Messages() {
		t.Fatalf("unexpected delivery (a second copy of q?): %s", m.Data())
	}
}

// TestDigestCarrierExpiringAfterSealingHandsItOver: a carrier that sealed
// its digest and then expired while it waited for its turn (scenario seed
// 181224913: carriers of a task expiring as their windows closed) hands
// the digest to its next item before it expires, so the other task's item
// is still sent.
func TestDigestCarrierExpiringAfterSealingHandsItOver(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	// An empty bucket at the session's start and one token every 2 s: the
	// carrier waits for its turn past its expiry.
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":0.5,"burst":1,"concurrency":2}`})
	carrier, item := digestJob("x", time.Second), digestJob("y", time.Second)
	stageSealedDigest(t, js, &carrier, &item, nil)
	redeliverCarrier(t, js, &carrier, func(j *contract.Job) {
		j.ExpiresAt = time.Now().Add(1200 * time.Millisecond).UTC()
	})

	natstest.Eventually(t, 20*time.Second, func() bool { return sentOf(t, js, "y") == 1 }, "the other task's item sent")
	require.Zero(t, sentOf(t, js, "x"), "the expired carrier is not sent")
	require.Equal(t, item.ID, lastSent(t, js, "y").CarriedBy, "the item carried the digest handed to it")
}

// TestDigestMaybeSentIsSentAgainUnderItsKey: a digest whose carrier's
// attempt may have reached the recipient (a timeout), the carrier then
// expiring (scenario seed 27832683), is handed to the next item, which
// sends it again as it is, under the first carrier's Idempotency-Key (the
// sandbox's provider id names it), not under its own: the recipient gets
// it once. The expired carrier stays an item, sent with the digest.
func TestDigestMaybeSentIsSentAgainUnderItsKey(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4}`})
	carrier, item := digestJob("x", time.Second), digestJob("y", time.Second)
	// The attempt that may have reached the recipient, sent under the
	// carrier's job id.
	stageSealedDigest(t, js, &carrier, &item, map[string]any{"send_key": carrier.ID, "send_body": "2 updates: from x, from y"})
	// The carrier's retry, its answer lost, comes after its task expired.
	redeliverCarrier(t, js, &carrier, func(j *contract.Job) {
		j.MaybeSent, j.Attempts = true, 1
		j.ExpiresAt = time.Now().Add(-time.Second).UTC()
	})

	natstest.Eventually(t, 20*time.Second, func() bool { return sentOf(t, js, "y") == 1 }, "the other task's item sent")
	ev := lastSent(t, js, "y")
	require.Equal(t, carrier.ID, ev.CarriedBy, "carried by the job whose id was the key")
	require.Equal(t, "sbx-"+carrier.ID, ev.ProviderID, "sent again under the first attempt's Idempotency-Key")
	natstest.Eventually(t, 5*time.Second, func() bool { return sentOf(t, js, "x") == 1 }, "the expired carrier, maybe sent, is sent with the digest")
}

// stageSealedDigest stores a sealed digest of carrier and item in the
// ledger, with extra fields set in its JSON, and marks both tasks
// processing, as a dispatch killed after sealing it would leave them.
func stageSealedDigest(t *testing.T, js jetstream.JetStream, carrier, item *contract.Job, extra map[string]any) {
	t.Helper()
	ctx := t.Context()
	ledger, err := js.KeyValue(ctx, contract.BucketLedger)
	require.NoError(t, err)
	e := digestEntry{State: digestSealed, Carrier: carrier.ID, ClosesAt: time.Now().UTC(),
		Items: []contract.Job{digestItem(carrier), digestItem(item)}}
	data, err := json.Marshal(&e)
	require.NoError(t, err)
	raw := map[string]any{}
	require.NoError(t, json.Unmarshal(data, &raw))
	maps.Copy(raw, extra)
	data, err = json.Marshal(raw)
	require.NoError(t, err)
	_, err = ledger.Put(ctx, digestKey(carrier), data)
	require.NoError(t, err)
	control, err := js.KeyValue(ctx, contract.BucketControl)
	require.NoError(t, err)
	for _, task := range []string{carrier.TaskID, item.TaskID} {
		data, _ := json.Marshal(contract.Control{State: contract.StateProcessing, At: time.Now().UTC()})
		_, err = control.Put(ctx, task, data)
		require.NoError(t, err)
	}
}

// TestDigestCarrierHeldOnItsAccountHandsItOver: a carrier whose account
// must not send (here disabled; in scenario seed 605087273 paused after
// 401s) and whose task names no other account is held there; the item of
// another task, whose pool has a healthy account, must not wait with it:
// the digest goes to the item, which moves to that account and sends it.
func TestDigestCarrierHeldOnItsAccountHandsItOver(t *testing.T) {
	t.Parallel()
	js := topologytest.Start(t).JS
	putAccounts(t, js, map[string]string{
		"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4,"enabled":false}`,
		"b": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4}`,
	})
	carrier, item := digestJob("x", time.Second), digestJob("y", time.Second)
	carrier.Pool, item.Pool = []string{"a"}, []string{"a", "b"}
	stageSealedDigest(t, js, &carrier, &item, nil)
	redeliverCarrier(t, js, &carrier, nil)

	natstest.Eventually(t, 20*time.Second, func() bool { return sentOf(t, js, "y") == 1 }, "the other task's item sent")
	require.Zero(t, sentOf(t, js, "x"), "the held carrier is not sent")
	ev := lastSent(t, js, "y")
	require.Equal(t, item.ID, ev.CarriedBy, "the item carried the digest handed to it")
	require.Equal(t, "b", ev.Account, "through its pool's healthy account")
}

// TestDigestCarrierCopyKeepsItsOwnText: a carrier that sealed its digest
// and must then leave its account (disabled, its pool naming another) is
// published there with its own text, not the digest's. A copy carrying
// the digest's text and later handed over (its task paused) was sent
// alone with the other items' texts under its own key, while the next
// carrier sent them again under its key (multi-process scenario seed
// 585014640: accepted under 2 idempotency keys).
func TestDigestCarrierCopyKeepsItsOwnText(t *testing.T) {
	t.Parallel()
	srv := topologytest.Start(t)
	js := srv.JS
	putAccounts(t, js, map[string]string{
		"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4,"enabled":false}`,
		"b": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4}`,
	})
	carrier, item := digestJob("x", time.Second), digestJob("y", time.Second)
	carrier.Pool, item.Pool = []string{"a", "b"}, []string{"a", "b"}
	stageSealedDigest(t, js, &carrier, &item, nil)
	copies, err := srv.NC.SubscribeSync(contract.JobSubject("b", contract.PriorityNormal))
	require.NoError(t, err)
	redeliverCarrier(t, js, &carrier, nil)

	m, err := copies.NextMsg(20 * time.Second)
	require.NoError(t, err, "the carrier moved to account b")
	var moved contract.Job
	require.NoError(t, json.Unmarshal(m.Data, &moved))
	require.Equal(t, carrier.ID, moved.ID)
	require.Equal(t, "from x", moved.Body, "the copy carries the carrier's own text")
	natstest.Eventually(t, 20*time.Second, func() bool { return sentOf(t, js, "y") == 1 && sentOf(t, js, "x") == 1 }, "the digest sent from b")
	require.Equal(t, "b", lastSent(t, js, "y").Account)
}

// redeliverCarrier starts the service on js, waits for its view of the run
// states, and publishes carrier again on account "a" as the carrier copy
// of its sealed digest (a redelivery after a crash), adjust (optional)
// changing it first.
func redeliverCarrier(t *testing.T, js jetstream.JetStream, carrier *contract.Job, adjust func(*contract.Job)) {
	t.Helper()
	runService(t, js, Config{Logger: logtest.Logger()})
	time.Sleep(time.Second) // the service's view of the run states
	carrier.DigestCarrier, carrier.Recheck = true, true
	if adjust != nil {
		adjust(carrier)
	}
	data, err := json.Marshal(carrier)
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)
}

// TestDigestBacklogFollowsEachDelivery: the backlog rule (digest_backlog
// 5) sees the normal lane's queue as each job was delivered. A burst's
// first job, delivered while it alone is queued, goes alone; the next,
// delivered once 20 more are queued, merges (a depth read at the first
// job and kept for a second sent a whole burst alone); once the queue is
// down to 5, jobs go alone again at once. A high job merges while the
// normal lane's queue is long.
func TestDigestBacklogFollowsEachDelivery(t *testing.T) {
	t.Parallel()
	g := newHandoffRig(t)
	sched := newScheduler(nil, 4)
	publish := func(from, n int) {
		for i := from; i < from+n; i++ {
			job := digestJob("burst", 0)
			job.ID, job.Index, job.To = contract.JobID("burst", i, false), i, fmt.Sprintf("user-%d", i)
			data, err := json.Marshal(&job)
			require.NoError(t, err)
			_, err = g.js.Publish(t.Context(), contract.JobSubject("a", contract.PriorityNormal), data)
			require.NoError(t, err)
		}
	}
	// take delivers the next job as handle does (its queue noted while it
	// is being handled) on an account with digest_backlog 5, and
	// acknowledges it.
	take := func() *delivery {
		tk := g.next(t)
		meta, err := tk.msg.Metadata()
		require.NoError(t, err)
		turn := sched.begin(laneNormal)
		tk.noteQueue(sched, laneNormal, meta)
		turn.finish()
		require.NoError(t, tk.msg.Ack())
		a := *tk.acct
		a.DigestBacklog = 5
		tk.acct = &a
		return tk.delivery
	}
	window := g.svc.cfg.DigestWindow
	require.Positive(t, window)

	publish(0, 1)
	d := take()
	require.Equal(t, 1, d.queued)
	require.Zero(t, g.r.digestWindow(t.Context(), d), "the burst's first job: 1 queued, sent alone")

	publish(1, 20)
	// The server counts a stored message in its consumers' pending
	// counts a moment later (a signal): deliver once it has.
	require.Eventually(t, func() bool {
		info, err := g.cons.Info(t.Context())
		return err == nil && info.NumPending == 20
	}, 5*time.Second, 5*time.Millisecond)
	d = take()
	require.Equal(t, 20, d.queued)
	require.Equal(t, window, g.r.digestWindow(t.Context(), d), "right after, 20 queued: merges")

	high := *d
	high.lane, high.queued = laneHigh, 1
	require.Equal(t, window, g.r.digestWindow(t.Context(), &high), "a high job while the normal lane holds 19: merges")

	for range 14 {
		d = take()
	}
	require.Equal(t, 6, d.queued)
	require.Equal(t, window, g.r.digestWindow(t.Context(), d), "6 queued: merges")
	d = take()
	require.Equal(t, 5, d.queued)
	require.Zero(t, g.r.digestWindow(t.Context(), d), "5 queued, not above digest_backlog: sent alone")
}
