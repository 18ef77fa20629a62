package crosstask

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/services/dispatch"
)

// putPolicy writes a value of KV broadcast_policy, as an operator does.
func putPolicy(t *testing.T, ts *pipelinetest.Server, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	_, err = kv.Put(ctx, key, []byte(value))
	require.NoError(t, err)
}

// codesOf counts a task's events of kind by code.
func codesOf(evs []contract.Event, kind contract.EventKind) map[string]int {
	out := map[string]int{}
	for _, ev := range harness.EventsOf(evs, kind) {
		out[ev.Code]++
	}
	return out
}

// TestPolicyFrequencyCapAcrossReplicas: with a marketing cap of 2 per 24 h,
// four marketing tasks to the same 10 recipients, two through an account
// owned by one dispatch replica and two through an account owned by the
// other, all running at once, reach each recipient exactly twice: 20 sent,
// 20 skipped with code frequency_cap, no provider call beyond the cap. A
// transactional task to them is sent in full, and after both replicas are
// replaced (a restart) a fifth marketing task is skipped in full: the
// counts live in JetStream, not in a process.
func TestPolicyFrequencyCapAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := harness.NewDispatchEnv(t, dispatch.Config{})
	_, rec := harness.StartRecordedGateway(t, harness.GatewayOK(), 0)
	for _, a := range []string{"fa", "fb"} {
		e.TS.PutAccount(t, a, harness.WebhookAccount(rec.URL, `"rate_per_sec":200,"burst":20,"concurrency":4`))
	}
	putPolicy(t, e.TS, contract.PolicyDefault, `{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"}]}`)
	r1, r2 := e.StartReplica(), e.StartReplica()
	// The fair share gives each replica one of the two accounts: wait for
	// it, so the tasks race across replicas, not within one.
	e.WaitAccountsApart("fa", "fb")
	holders := e.LeaseHolders("fa", "fb")
	const n = 10
	people := pipelinetest.Recipients("fc", n)
	var ids []string
	for i := range 4 {
		id := fmt.Sprintf("fcap-%d", i)
		ids = append(ids, id)
		acct := []string{"fa", "fb"}[i%2]
		harness.Submit(t, e.TS, contract.Task{ID: id, Channel: "webhook", Template: "offer " + id, Recipients: people, Accounts: []string{acct}})
	}
	sent, skipped := 0, 0
	for _, id := range ids {
		p := e.TS.WaitFinal(t, id, 60*time.Second)
		sent, skipped = sent+p.Sent, skipped+p.Skipped
		want := map[string]int{}
		if p.Skipped > 0 {
			want[contract.CodeFrequencyCap] = p.Skipped
		}
		require.Equal(t, want, codesOf(e.TS.Events(t, id), contract.EventSkipped), id)
	}
	perRecipient := map[string]int{}
	for _, h := range rec.Accepted() {
		perRecipient[h.To]++
	}
	by := e.SendsBy()
	t.Logf("4 tasks x %d recipients, cap 2: sent %d, skipped %d, provider calls %d, calls per replica %v", n, sent, skipped, len(rec.All()), by)
	require.Equal(t, [2]int{2 * n, 2 * n}, [2]int{sent, skipped}, "sent, skipped")
	require.Len(t, rec.All(), 2*n, "no provider call beyond the cap")
	require.Len(t, perRecipient, n)
	for to, c := range perRecipient {
		require.Equal(t, 2, c, to)
	}
	// Whichever replica reaches a recipient first takes both sends of the
	// cap, and one replica may win every race: that the other then skips
	// is the cap holding across replicas, so long as each account stayed
	// with its own replica all along.
	require.Equal(t, holders, e.LeaseHolders("fa", "fb"), "each account stayed with its replica")
	// Which tasks' sends the cap skips depends on the replicas' order:
	// every skip, whichever task it hit, names the cap.
	skips := 0
	for _, id := range ids {
		for _, ev := range harness.EventsOf(e.TS.Events(t, id), contract.EventSkipped) {
			skips++
			require.Contains(t, ev.Error, "frequency cap reached (marketing: 2 per 24h0m0s)", id)
		}
	}
	require.Equal(t, 2*n, skips, "skipped events")

	tr := contract.Task{ID: "fcap-tx", Channel: "webhook", Template: "receipt", Recipients: people, Category: contract.CategoryTransactional}
	harness.Submit(t, e.TS, tr)
	p := e.TS.WaitFinal(t, tr.ID, 30*time.Second)
	require.Equal(t, [2]int{n, 0}, [2]int{p.Sent, p.Skipped}, "transactional bypasses the cap")

	r1.Stop()
	r2.Stop()
	e.StartReplica()
	e.StartReplica()
	late := contract.Task{ID: "fcap-late", Channel: "webhook", Template: "one more", Recipients: people}
	harness.Submit(t, e.TS, late)
	p = e.TS.WaitFinal(t, late.ID, 60*time.Second)
	require.Equal(t, [3]int{0, n, 3 * n}, [3]int{p.Sent, p.Skipped, len(rec.All())}, "after a restart: sent, skipped, provider calls")
	require.Equal(t, contract.StateFailed, p.State)
}

// fakeClock is a clock running at real speed from a chosen instant.
type fakeClock struct{ offset time.Duration }

func newFakeClock(at time.Time) *fakeClock { return &fakeClock{offset: time.Until(at)} }

// shanghaiAt is hour:00 in Shanghai, days after today there.
func shanghaiAt(t *testing.T, days, hour int) time.Time {
	t.Helper()
	sh, err := time.LoadLocation("Asia/Shanghai")
	require.NoError(t, err)
	y, m, d := time.Now().In(sh).Date()
	return time.Date(y, m, d+days, hour, 0, 0, 0, sh)
}

func (c *fakeClock) Now() time.Time { return time.Now().Add(c.offset) }

// at is the fake time of a real instant.
func (c *fakeClock) at(real time.Time) time.Time { return real.Add(c.offset) }

// TestPolicyQuietHours: quiet hours 21:00-09:00 for marketing, default zone
// Asia/Shanghai, with dispatch's clock at 08:59:56 in Shanghai. A
// recipient whose tz variable puts it at 03:59 (Africa/Nairobi) is held:
// a retrying event coded quiet_hours says until 09:00 its time, and it is
// not sent. A phone number of China (+86, its zone from the number) and a
// recipient without zone (the default) wait and are sent only once it is
// 09:00 in Shanghai; one in New York (19:59) is sent at once; a
// transactional task to the Nairobi recipient is sent at once; and a held
// recipient whose task expires first is expired, never sent. Progress
// says the task is waiting, with the hold's reason, and is not paused by
// the circuit breaker.
func TestPolicyQuietHours(t *testing.T) {
	t.Parallel()
	sh, err := time.LoadLocation("Asia/Shanghai")
	require.NoError(t, err)
	start := time.Now()
	y, m, d := start.In(sh).Date()
	nine := time.Date(y, m, d+1, 9, 0, 0, 0, sh)
	clock := newFakeClock(nine.Add(-4 * time.Second))
	cfg := harness.FastRetries()
	cfg.Dispatch.Now = clock.Now
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, harness.GatewayOK(), 0)
	ts.PutAccount(t, "night", harness.WebhookAccount(rec.URL, `"rate_per_sec":50,"burst":5,"concurrency":2`))
	putPolicy(t, ts, contract.PolicyDefault, `{"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`)
	pipelinetest.StartPipeline(t, ts, cfg)

	task := contract.Task{ID: "quiet-1", Channel: "webhook", Template: "good morning", Recipients: []contract.Recipient{
		{To: "nairobi", Vars: map[string]any{"tz": "Africa/Nairobi"}},
		{To: "+8613800000001"},
		{To: "nozone"},
		{To: "newyork", Vars: map[string]any{"tz": "America/New_York"}},
	}}
	harness.Submit(t, ts, task)
	expiring := contract.Task{ID: "quiet-exp", Channel: "webhook", Template: "too late", ExpiresAt: time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano),
		Recipients: []contract.Recipient{{To: "nairobi-2", Vars: map[string]any{"tz": "Africa/Nairobi"}}}}
	harness.Submit(t, ts, expiring)
	tx := contract.Task{ID: "quiet-tx", Channel: "webhook", Template: "your code", Category: contract.CategoryTransactional,
		Recipients: []contract.Recipient{{To: "nairobi", Vars: map[string]any{"tz": "Africa/Nairobi"}}}}
	harness.Submit(t, ts, tx)

	require.Equal(t, contract.StateSucceeded, ts.WaitFinal(t, tx.ID, 20*time.Second).State, "transactional is not held")
	ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool { return p.Sent == 3 }, "three sent after 09:00")
	pe := ts.WaitFinal(t, expiring.ID, 20*time.Second)
	require.Equal(t, [2]int{0, 1}, [2]int{pe.Sent, pe.Expired}, "expires_at wins over the wait")
	time.Sleep(time.Second) // a wrongly released Nairobi send would show now

	firstSent := map[string]time.Time{}
	var calls []string
	for _, h := range rec.Accepted() {
		calls = append(calls, h.To)
		if _, ok := firstSent[h.To]; !ok {
			firstSent[h.To] = clock.at(h.At)
		}
	}
	sort.Strings(calls)
	t.Logf("clock started at %s Shanghai; sends (fake time): %v", clock.at(start).In(sh).Format("15:04:05"), firstSent)
	require.Equal(t, []string{"+8613800000001", "nairobi", "newyork", "nozone"}, calls, "one call each; nairobi only for the transactional task")
	require.True(t, firstSent["newyork"].Before(nine), "New York (19:59) is not in quiet hours: sent at %s", firstSent["newyork"].In(sh))
	for _, to := range []string{"+8613800000001", "nozone"} {
		require.False(t, firstSent[to].Before(nine), "%s sent at %s Shanghai, before 09:00", to, firstSent[to].In(sh))
	}
	holds := map[string]string{}
	for _, ev := range harness.EventsOf(ts.Events(t, task.ID), contract.EventRetrying) {
		require.Equal(t, contract.CodeQuietHours, ev.Code)
		holds[ev.To] = ev.Error
	}
	require.Len(t, holds, 3, "nairobi, the Chinese number and nozone waited: %v", holds)
	nairobi, err := time.LoadLocation("Africa/Nairobi")
	require.NoError(t, err)
	y, m, d = clock.Now().In(nairobi).Date()
	require.Contains(t, holds["nairobi"], "zone Africa/Nairobi (from tz); waiting until "+time.Date(y, m, d, 9, 0, 0, 0, nairobi).Format(time.RFC3339))
	require.Contains(t, holds["+8613800000001"], "zone Asia/Shanghai (from phone)")
	require.Contains(t, holds["nozone"], "zone Asia/Shanghai (from default)")
	p := ts.Progress(t, task.ID)
	require.Equal(t, [3]int{4, 3, 1}, [3]int{p.Total, p.Sent, p.Retrying}, "total, sent, retrying: Nairobi waits until its 09:00")
	require.Equal(t, contract.StateProcessing, p.State)
	require.True(t, strings.HasPrefix(p.Error, "waiting: quiet hours 21:00-09:00 in the recipient's zone"), "progress says why it waits: %q", p.Error)
}

// TestPolicyQuietHoursTaskTZ: quiet hours 21:00-09:00 for marketing,
// default zone Asia/Shanghai, with dispatch's clock at 03:00 in Shanghai.
// A task whose defaults say tz America/Sao_Paulo (16:00 there) reaches at
// once a recipient without zone, a Chinese phone number (the task's zone
// comes before the number's region) and one whose own tz names no zone,
// while a recipient whose own tz is Asia/Tokyo (04:00) waits: its own zone
// wins. A task whose defaults say Asia/Kolkata (00:30) holds a recipient
// without zone, naming the task's zone. All zones used keep no daylight
// saving, so the hours hold on any date.
func TestPolicyQuietHoursTaskTZ(t *testing.T) {
	t.Parallel()
	clock := newFakeClock(shanghaiAt(t, 0, 3))
	cfg := harness.FastRetries()
	cfg.Dispatch.Now = clock.Now
	ts := pipelinetest.Start(t)
	_, rec := harness.StartRecordedGateway(t, harness.GatewayOK(), 0)
	ts.PutAccount(t, "night", harness.WebhookAccount(rec.URL, `"rate_per_sec":50,"burst":5,"concurrency":2`))
	putPolicy(t, ts, contract.PolicyDefault, `{"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`)
	pipelinetest.StartPipeline(t, ts, cfg)

	day := contract.Task{ID: "quiet-tasktz", Channel: "webhook", Template: "hello", Defaults: map[string]any{"tz": "America/Sao_Paulo"},
		Recipients: []contract.Recipient{
			{To: "nozone"},
			{To: "+8613800000001"},
			{To: "badtz", Vars: map[string]any{"tz": "Nowhere/Else"}},
			{To: "tokyo", Vars: map[string]any{"tz": "Asia/Tokyo"}},
		}}
	harness.Submit(t, ts, day)
	night := contract.Task{ID: "quiet-tasktz-night", Channel: "webhook", Template: "hello", Defaults: map[string]any{"tz": "Asia/Kolkata"},
		Recipients: []contract.Recipient{{To: "nozone-2"}}}
	harness.Submit(t, ts, night)

	ts.WaitProgress(t, day.ID, 20*time.Second, func(p *contract.Progress) bool { return p.Sent == 3 }, "three sent in the task's zone")
	ts.WaitProgress(t, night.ID, 20*time.Second, func(p *contract.Progress) bool { return p.Retrying == 1 }, "the night task's recipient waits")
	time.Sleep(time.Second) // a wrongly released Tokyo or Kolkata send would show now

	var calls []string
	for _, h := range rec.Accepted() {
		calls = append(calls, h.To)
	}
	sort.Strings(calls)
	require.Equal(t, []string{"+8613800000001", "badtz", "nozone"}, calls, "one call each, none for tokyo or nozone-2")
	holds := map[string]string{}
	for _, id := range []string{day.ID, night.ID} {
		for _, ev := range harness.EventsOf(ts.Events(t, id), contract.EventRetrying) {
			require.Equal(t, contract.CodeQuietHours, ev.Code)
			holds[ev.To] = ev.Error
		}
	}
	require.Len(t, holds, 2, "only tokyo and nozone-2 waited: %v", holds)
	require.Contains(t, holds["tokyo"], "zone Asia/Tokyo (from tz)")
	require.Contains(t, holds["nozone-2"], "zone Asia/Kolkata (from defaults.tz)")
	p := ts.Progress(t, day.ID)
	require.Equal(t, [3]int{4, 3, 1}, [3]int{p.Total, p.Sent, p.Retrying}, "total, sent, retrying")
}

// TestPolicyTestRecipientsBypass: a marketing cap of 1 per 24 h and quiet
// hours 21:00-09:00 in Asia/Shanghai, with dispatch's clock at 03:00
// there. The task's test recipients are sent before approval although
// qa-1 is at its cap (one send recorded from an earlier task) and both
// are inside quiet hours; their counts are unchanged (qa-1 still one
// send, qa-2 none). A suppressed test recipient is still skipped, code
// suppressed. After approval the task's own recipient is held by the
// quiet hours: the policy is in force, only test sends bypass it.
func TestPolicyTestRecipientsBypass(t *testing.T) {
	t.Parallel()
	clock := newFakeClock(shanghaiAt(t, 0, 3))
	cfg := harness.FastRetries()
	cfg.Dispatch.Now = clock.Now
	ts := pipelinetest.Start(t)
	ctx := t.Context()
	_, rec := harness.StartRecordedGateway(t, harness.GatewayOK(), 0)
	ts.PutAccount(t, "qa", harness.WebhookAccount(rec.URL, `"rate_per_sec":50,"burst":5,"concurrency":2`))
	putPolicy(t, ts, contract.PolicyDefault, `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}],
		"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai"}}`)
	counter, err := policy.OpenCounter(ctx, ts.JS)
	require.NoError(t, err)
	caps, err := contract.DecodePolicy([]byte(`{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`))
	require.NoError(t, err)
	over, err := counter.Reserve(ctx, "webhook", "qa-1", "earlier.0", contract.CategoryMarketing, caps.FrequencyCaps, clock.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Nil(t, over)
	list, err := suppress.Open(ctx, ts.JS)
	require.NoError(t, err)
	_, err = list.Put(ctx, "webhook", contract.Suppression{To: "qa-3", Reason: contract.ReasonOptOut, Source: "test"})
	require.NoError(t, err)
	pipelinetest.StartPipeline(t, ts, cfg)

	task := contract.Task{ID: "policy-qa", Channel: "webhook", Template: "preview",
		TestRecipients: []contract.Recipient{{To: "qa-1"}, {To: "qa-2"}, {To: "qa-3"}},
		Recipients:     []contract.Recipient{{To: "r-1"}}}
	harness.Submit(t, ts, task)
	ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateAwaitingApproval }, "awaiting approval")
	natstest.Eventually(t, 20*time.Second, func() bool {
		evs := ts.Events(t, task.ID)
		return len(harness.EventsOf(evs, contract.EventSent))+len(harness.EventsOf(evs, contract.EventSkipped)) == 3
	}, "each test recipient sent or skipped")
	time.Sleep(time.Second) // a late or second send would show now

	sends, err := counter.Sends(ctx, "webhook", "qa-2")
	require.NoError(t, err)
	require.Empty(t, sends, "the test send to qa-2 is not counted")
	sends, err = counter.Sends(ctx, "webhook", "qa-1")
	require.NoError(t, err)
	require.Len(t, sends, 1, "qa-1's count is unchanged: %v", sends)
	require.Equal(t, "earlier.0", sends[0].Job)
	var calls []string
	for _, h := range rec.Accepted() {
		calls = append(calls, h.To)
	}
	sort.Strings(calls)
	require.Equal(t, []string{"qa-1", "qa-2"}, calls, "the test recipients at the cap and in quiet hours are sent; the suppressed one is not")
	evs := ts.Events(t, task.ID)
	require.Empty(t, harness.EventsOf(evs, contract.EventRetrying), "no test recipient was held")
	skipped := harness.EventsOf(evs, contract.EventSkipped)
	require.Len(t, skipped, 1)
	require.Equal(t, [2]string{"qa-3", contract.CodeSuppressed}, [2]string{skipped[0].To, skipped[0].Code})

	harness.Control(t, ts, task.ID, contract.ActionResume)
	p := ts.WaitProgress(t, task.ID, 20*time.Second, func(p *contract.Progress) bool { return p.Retrying == 1 }, "the task's recipient waits")
	require.Zero(t, p.Sent)
	require.Equal(t, map[string]int{contract.CodeQuietHours: 1}, codesOf(ts.Events(t, task.ID), contract.EventRetrying))
	require.Len(t, rec.Accepted(), 2, "no send beyond the test recipients")
}

// TestPolicyJobWaitingForCapsHoldsNoReservation: a marketing job that
// waits for its account's per-recipient interval holds no reservation
// under the frequency cap meanwhile, so when it then expires, or its task
// is cancelled, it has taken no other task's slot: a marketing task to the
// same recipients submitted during the wait is sent (scenario seed
// 257254433: a job that reserved, waited for the interval and expired
// unsent made a third task skip for a cap nobody had reached).
func TestPolicyJobWaitingForCapsHoldsNoReservation(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ctx := t.Context()
	_, rec := harness.StartRecordedGateway(t, harness.GatewayOK(), 0)
	ts.PutAccount(t, "gap", harness.WebhookAccount(rec.URL, `"rate_per_sec":100,"burst":10,"concurrency":4,"per_recipient_interval":"5s"`))
	putPolicy(t, ts, contract.PolicyDefault, `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`)
	counter, err := policy.OpenCounter(ctx, ts.JS)
	require.NoError(t, err)
	pipelinetest.StartPipeline(t, ts, harness.FastRetries())

	people := []contract.Recipient{{To: "exp-1"}, {To: "can-1"}}
	warm := contract.Task{ID: "rel-warm", Channel: "webhook", Template: "receipt", Recipients: people, Category: contract.CategoryTransactional}
	harness.Submit(t, ts, warm)
	require.Equal(t, 2, ts.WaitFinal(t, warm.ID, 20*time.Second).Sent)
	// Both marketing jobs now wait out the 5 s interval.
	expiring := contract.Task{ID: "rel-exp", Channel: "webhook", Template: "offer", Recipients: people[:1],
		ExpiresAt: time.Now().Add(2500 * time.Millisecond).UTC().Format(time.RFC3339Nano)}
	cancelled := contract.Task{ID: "rel-can", Channel: "webhook", Template: "offer", Recipients: people[1:]}
	harness.Submit(t, ts, expiring)
	harness.Submit(t, ts, cancelled)
	ts.WaitProgress(t, cancelled.ID, 10*time.Second, func(p *contract.Progress) bool { return p.State == contract.StateProcessing }, "processing")
	time.Sleep(500 * time.Millisecond) // the jobs reach dispatch and wait
	next := contract.Task{ID: "rel-next", Channel: "webhook", Template: "offer", Recipients: people}
	harness.Submit(t, ts, next)
	for _, to := range []string{"exp-1", "can-1"} {
		sends, err := counter.Sends(ctx, "webhook", to)
		require.NoError(t, err)
		require.Empty(t, sends, "no reservation for %s while its jobs wait for the interval", to)
	}
	require.True(t, harness.Control(t, ts, cancelled.ID, "cancel").OK)
	require.Equal(t, contract.StateFailed, ts.WaitFinal(t, expiring.ID, 20*time.Second).State)
	require.Len(t, harness.EventsOf(ts.Events(t, expiring.ID), contract.EventExpired), 1, "expired events")
	require.Equal(t, contract.StateCancelled, ts.WaitFinal(t, cancelled.ID, 20*time.Second).State)

	p := ts.WaitFinal(t, next.ID, 30*time.Second)
	require.Equal(t, [2]int{2, 0}, [2]int{p.Sent, p.Skipped}, "the marketing task submitted during the wait is sent: sent, skipped")
	var calls []string
	for _, h := range rec.Accepted() {
		calls = append(calls, h.To)
	}
	sort.Strings(calls)
	require.Equal(t, []string{"can-1", "can-1", "exp-1", "exp-1"}, calls, "the warm-up and the next task reached each recipient")
	for _, to := range []string{"exp-1", "can-1"} {
		sends, err := counter.Sends(ctx, "webhook", to)
		require.NoError(t, err)
		require.Len(t, sends, 1, to)
		require.Equal(t, "rel-next", strings.Split(sends[0].Job, ".")[0], to)
	}
}
