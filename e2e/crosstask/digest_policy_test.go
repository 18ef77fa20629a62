package crosstask

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/policy"
)

// quietMarketing is quiet hours 21:00-09:00 for marketing, recipients
// without a zone of their own in Shanghai.
const quietMarketing = `{"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`

// startQuietDigestPipeline runs the pipeline with dispatch's policy clock
// at lead before the next 09:00 in Shanghai (which it returns, with the
// clock), account "hook" sending to a recording gateway without faults,
// and no policy yet.
func startQuietDigestPipeline(t *testing.T, lead time.Duration) (*pipelinetest.Server, *harness.RecordedGateway, *fakeClock, time.Time) {
	t.Helper()
	nine := shanghaiAt(t, 1, 9)
	clock := newFakeClock(nine.Add(-lead))
	cfg := harness.FastRetries()
	cfg.Dispatch.Now = clock.Now
	ts := pipelinetest.Start(t)
	gw := harness.StartGateway(t, harness.GatewayOK())
	ts.PutAccount(t, "hook", harness.WebhookAccount(gw.URL, `"rate_per_sec":200,"burst":20,"concurrency":4`))
	pipelinetest.StartPipeline(t, ts, cfg)
	return ts, gw, clock, nine
}

// acceptedBefore lists the accepted requests that arrived before at on the
// fake clock, by Idempotency-Key.
func acceptedBefore(gw *harness.RecordedGateway, clock *fakeClock, at time.Time) []string {
	var early []string
	for _, h := range gw.Accepted() {
		if clock.at(h.At).Before(at) {
			early = append(early, h.Key+" to "+h.To)
		}
	}
	return early
}

// digestItemsOf counts the items of tasks that the digests' entries hold
// (joined or taken out, open or sealed).
func digestItemsOf(t *testing.T, ts *pipelinetest.Server, tasks ...string) int {
	t.Helper()
	n := 0
	for _, d := range pipelinetest.DigestEntries(t, ts.JS, "webhook") {
		for _, j := range slices.Concat(d.Items, d.Out) {
			if slices.Contains(tasks, j.TaskID) {
				n++
			}
		}
	}
	return n
}

// acceptedPer counts the accepted requests per recipient.
func acceptedPer(gw *harness.RecordedGateway) map[string]int {
	per := map[string]int{}
	for _, h := range gw.Accepted() {
		per[h.To]++
	}
	return per
}

// TestDigestPolicyQuietHours: quiet hours 21:00-09:00 for marketing in
// Shanghai, dispatch's clock 25 s before 09:00. Three marketing tasks with
// one digest_key join their digests to five recipients before the quiet
// hours are set; set during the 6 s window, the digests' seal finds every
// item inside them: each leaves and waits alone (one retrying event coded
// quiet_hours per item, 15), nothing is sent before 09:00, and at 09:00
// the items merge again: 5 requests of 3 items. Two more tasks submitted
// inside the quiet hours never join (no digest entry names them while
// they are held): each waits alone (10 retrying events) and merges at
// 09:00 (5 requests of 2 items). Every task sends 5, no request is
// repeated.
func TestDigestPolicyQuietHours(t *testing.T) {
	t.Parallel()
	ts, gw, clock, nine := startQuietDigestPipeline(t, 25*time.Second)
	joined := []string{"dq-a", "dq-b", "dq-c"}
	for _, id := range joined {
		harness.Submit(t, ts, digestTask(id, "u", 5, "news", "6s"))
	}
	natstest.Eventually(t, 20*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, ts.JS, "webhook") == 15
	}, "the items joined their digests")
	putPolicy(t, ts, contract.PolicyDefault, quietMarketing)
	require.Zero(t, gw.Ledger().Requests, "nothing sent while the digests are open")
	inside := []string{"dq-d", "dq-e"}
	for _, id := range inside {
		harness.Submit(t, ts, digestTask(id, "v", 5, "news", "6s"))
	}
	// Inside the quiet hours they never join a digest: each waits alone.
	deadline := time.Now().Add(20 * time.Second)
	for held := 0; held < 10; {
		require.Zero(t, digestItemsOf(t, ts, inside...), "items submitted inside the quiet hours in a digest")
		require.True(t, time.Now().Before(deadline), "%d of 10 items submitted inside the quiet hours waiting", held)
		time.Sleep(50 * time.Millisecond)
		held = 0
		for _, id := range inside {
			if p := ts.Progress(t, id); p != nil {
				held += p.Retrying
			}
		}
	}

	all := slices.Concat(joined, inside)
	for _, id := range all {
		p := ts.WaitFinal(t, id, 60*time.Second)
		require.Equal(t, [3]int{5, 5, 0}, [3]int{p.Total, p.Sent, p.Retrying}, "%s total, sent, retrying", id)
	}
	time.Sleep(500 * time.Millisecond) // nothing more may arrive
	require.Empty(t, acceptedBefore(gw, clock, nine), "requests before 09:00 in Shanghai")
	for _, id := range all {
		require.Equal(t, map[string]int{contract.CodeQuietHours: 5}, codesOf(ts.Events(t, id), contract.EventRetrying),
			"%s: each item waited once for the quiet hours", id)
	}
	led := gw.Ledger()
	require.Equal(t, 5+5, led.Requests, "one request per recipient and group of tasks")
	require.Equal(t, 0, led.Duplicates)
	checkDigests(t, ts, gw, joined, 5)
	checkDigests(t, ts, gw, inside, 5)
}

// TestDigestPolicyFrequencyCap: a marketing cap of 1 per 24 h. "full" got
// a marketing message before; "late" gets one while its digest is open
// (6 s window), so the seal finds its cap full; "room" has room. Three
// marketing tasks with one digest_key to the three: "full"'s items never
// join and "late"'s leave at the seal, each then skipped alone with code
// frequency_cap (2 per task); "room" gets one request carrying the three
// items, which counts once: its record holds one send, the digest's
// carrier. Each task: total 3, sent 1, skipped 2; three requests in all,
// one per recipient.
func TestDigestPolicyFrequencyCap(t *testing.T) {
	t.Parallel()
	ts, gw := startDigestPipeline(t)
	putPolicy(t, ts, contract.PolicyDefault, `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`)
	one := func(id, to string) contract.Task {
		return contract.Task{ID: id, Channel: "webhook", Template: "offer " + id, Recipients: []contract.Recipient{{To: to}}}
	}
	harness.Submit(t, ts, one("fq-pre", "full"))
	require.Equal(t, 1, ts.WaitFinal(t, "fq-pre", 20*time.Second).Sent)

	tasks := []string{"fq-a", "fq-b", "fq-c"}
	for _, id := range tasks {
		task := digestTask(id, "", 0, "news", "6s")
		task.Recipients = []contract.Recipient{{To: "full"}, {To: "late"}, {To: "room"}}
		harness.Submit(t, ts, task)
	}
	natstest.Eventually(t, 20*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, ts.JS, "webhook") == 6
	}, "the items to late and room joined their digests, full's did not")
	harness.Submit(t, ts, one("fq-late", "late"))
	require.Equal(t, 1, ts.WaitFinal(t, "fq-late", 20*time.Second).Sent)
	require.Equal(t, map[string]int{"full": 1, "late": 1}, acceptedPer(gw), "accepted requests per recipient while the digests are open")

	for _, id := range tasks {
		p := ts.WaitFinal(t, id, 40*time.Second)
		require.Equal(t, [3]int{3, 1, 2}, [3]int{p.Total, p.Sent, p.Skipped}, "%s total, sent, skipped", id)
		evs := ts.Events(t, id)
		require.Equal(t, map[string]int{contract.CodeFrequencyCap: 2}, codesOf(evs, contract.EventSkipped), id)
		var skippedTo []string
		for _, ev := range harness.EventsOf(evs, contract.EventSkipped) {
			skippedTo = append(skippedTo, ev.To)
			require.Equal(t, "frequency cap reached (marketing: 1 per 24h0m0s): 1 sent in the window", ev.Error)
		}
		require.ElementsMatch(t, []string{"full", "late"}, skippedTo, id)
	}
	time.Sleep(500 * time.Millisecond) // nothing more may arrive
	require.Equal(t, map[string]int{"full": 1, "late": 1, "room": 1}, acceptedPer(gw), "accepted requests per recipient")
	require.Equal(t, 3, gw.Ledger().Requests)
	var carrier string
	for _, id := range tasks {
		sent := harness.EventsOf(ts.Events(t, id), contract.EventSent)
		require.Len(t, sent, 1, id)
		require.Equal(t, "room", sent[0].To)
		if carrier == "" {
			carrier = sent[0].CarriedBy
		}
		require.Equal(t, carrier, sent[0].CarriedBy, "one digest carried every item to room")
		if sent[0].JobID == carrier {
			require.Equal(t, 3, sent[0].DigestSize)
		}
	}
	body := gw.Ledger().Bodies[carrier]
	require.True(t, strings.HasPrefix(body, "3 updates:"), "body %q", body)

	entry, err := harness.KVGet(t, ts, contract.BucketFrequency, policy.Key("webhook", "room"))
	require.NoError(t, err)
	var rec contract.FrequencyRecord
	require.NoError(t, json.Unmarshal(entry.Value(), &rec))
	require.Len(t, rec.Sends, 1, "the digest counts as one send")
	require.Equal(t, carrier, rec.Sends[0].Job, "reserved by the carrier's job id")
}

// TestDigestPolicyTransactionalNotHeld: dispatch's clock 25 s before
// 09:00 in Shanghai. A marketing task opens digests to three recipients
// (it carries them), a transactional task and a second marketing task
// join, then quiet hours 21:00-09:00 for marketing are set. At the seal
// the marketing items leave and wait (3 retrying events coded quiet_hours
// per marketing task); the carrier, held too, hands the digest to the
// transactional item, which is sent before 09:00, alone in its digest
// (digest_size 1). At 09:00 the marketing items merge again: 3 requests
// of 2 items, none before 09:00. Six requests in all, each task sent 3.
func TestDigestPolicyTransactionalNotHeld(t *testing.T) {
	t.Parallel()
	ts, gw, clock, nine := startQuietDigestPipeline(t, 25*time.Second)
	harness.Submit(t, ts, digestTask("mx-m1", "u", 3, "news", "6s"))
	natstest.Eventually(t, 20*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, ts.JS, "webhook") == 3
	}, "mx-m1 opened the digests")
	tx := digestTask("mx-t", "u", 3, "news", "6s")
	tx.Category = contract.CategoryTransactional
	harness.Submit(t, ts, tx)
	harness.Submit(t, ts, digestTask("mx-m2", "u", 3, "news", "6s"))
	natstest.Eventually(t, 20*time.Second, func() bool {
		return pipelinetest.DigestItemsWaiting(t, ts.JS, "webhook") == 9
	}, "mx-t and mx-m2 joined")
	putPolicy(t, ts, contract.PolicyDefault, quietMarketing)
	require.Zero(t, gw.Ledger().Requests, "nothing sent while the digests are open")

	pt := ts.WaitFinal(t, "mx-t", 30*time.Second)
	require.Equal(t, 3, pt.Sent)
	require.True(t, clock.Now().Before(nine), "the transactional task is sent before 09:00 (now %s)", clock.Now())
	marketingBefore := func() []string {
		var early []string
		for _, h := range acceptedBefore(gw, clock, nine) {
			if !strings.HasPrefix(h, "mx-t.") {
				early = append(early, h)
			}
		}
		return early
	}
	require.Empty(t, marketingBefore(), "requests of a marketing carrier before 09:00")
	txSent := harness.EventsOf(ts.Events(t, "mx-t"), contract.EventSent)
	require.Len(t, txSent, 3)
	for _, ev := range txSent {
		require.Equal(t, ev.JobID, ev.CarriedBy, "it carried the digest handed over to it")
		require.Equal(t, 1, ev.DigestSize, "without the marketing items")
	}
	require.Empty(t, codesOf(ts.Events(t, "mx-t"), contract.EventRetrying), "the transactional items never waited")

	marketing := []string{"mx-m1", "mx-m2"}
	for _, id := range marketing {
		p := ts.WaitFinal(t, id, 60*time.Second)
		require.Equal(t, [2]int{3, 0}, [2]int{p.Sent, p.Retrying}, "%s sent, retrying", id)
		require.Equal(t, map[string]int{contract.CodeQuietHours: 3}, codesOf(ts.Events(t, id), contract.EventRetrying), id)
	}
	time.Sleep(500 * time.Millisecond) // nothing more may arrive
	require.Empty(t, marketingBefore(), "requests of a marketing carrier before 09:00")
	led := gw.Ledger()
	require.Equal(t, 3+3, led.Requests)
	require.Equal(t, 0, led.Duplicates)
	checkDigests(t, ts, gw, marketing, 3)
}
