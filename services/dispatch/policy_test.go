package dispatch

import (
	"cmp"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/policy"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestExpiredJobReleasesAnEarlierReservation plays a job that reserved
// its send under a frequency cap and was handed off before the call (its
// task paused, the job parked): back, it finds itself expired, sends
// nothing, and releases the reservation, so the recipient's slot is free
// again (releaseEarlierFrequency; docs/policy.md, rule 2).
func TestExpiredJobReleasesAnEarlierReservation(t *testing.T) {
	t.Parallel()
	sends := reservedJobOutcome(t, contract.Job{}, nil, contract.EventExpired)
	require.Empty(t, sends, "the expired job's reservation is released")
}

// TestExpiredJobKeepsAReservationItsSendMayHaveUsed plays a job whose
// earlier send may have reached the recipient and which is then found
// expired (or its task cancelled, the same path): the reservation stays,
// or another capped task could reach the recipient over the cap
// (scenario seed 403378376; releaseFrequency; docs/policy.md, rule 4).
func TestExpiredJobKeepsAReservationItsSendMayHaveUsed(t *testing.T) {
	t.Parallel()
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		sends := reservedJobOutcome(t, contract.Job{Attempts: 1}, &ledgerEntry{State: "retrying", History: []contract.AttemptError{
			{Attempt: 1, Account: "a", Class: contract.ClassRetryable, Code: "timeout", Error: "context deadline exceeded"}}}, contract.EventExpired)
		require.Len(t, sends, 1, "the reservation of a send that timed out is kept")
	})
	t.Run("lost answer", func(t *testing.T) {
		t.Parallel()
		sends := reservedJobOutcome(t, contract.Job{MaybeSent: true}, nil, contract.EventExpired)
		require.Len(t, sends, 1, "the reservation of a send whose answer a dead process lost is kept")
	})
}

// TestFailedRetryKeepsTheReservationOfATimeout plays a job whose first
// send timed out (the provider may have taken it) and whose retry is
// refused for good: the job fails, and the reservation stays, for the
// timed-out send may have reached the recipient (releaseFrequency reads
// the ledger entry's history; docs/policy.md, rule 4).
func TestFailedRetryKeepsTheReservationOfATimeout(t *testing.T) {
	t.Parallel()
	timedOut := &ledgerEntry{State: "retrying", History: []contract.AttemptError{
		{Attempt: 1, Account: "a", Class: contract.ClassRetryable, Code: "timeout", Error: "context deadline exceeded"}}}
	sends := reservedJobOutcome(t, contract.Job{To: "bad-0", Attempts: 1}, timedOut, contract.EventFailed)
	require.Len(t, sends, 1, "the reservation of a send that timed out is kept when its retry fails")

	// Without the timeout the failed job's reservation is released.
	sends = reservedJobOutcome(t, contract.Job{To: "bad-0"}, nil, contract.EventFailed)
	require.Empty(t, sends, "a job refused without ever reaching the recipient frees its slot")
}

// reservedJobOutcome reserves a marketing job's send under a frequency
// cap of 1, stores entry (when not nil) as its ledger entry, and delivers
// the job (to base.To, default user-0, with base's Attempts and
// MaybeSent; already expired when want is the expired event) on a lane
// whose consumer exists already, so its delivery is not taken for one
// that may follow a lost answer. It waits for the job's event want and
// returns its recipient's reserved sends. The sandbox account refuses
// recipients starting with bad- for good.
func reservedJobOutcome(t *testing.T, base contract.Job, entry *ledgerEntry, want contract.EventKind) []contract.FrequencySend {
	t.Helper()
	js := topologytest.Start(t).JS
	ctx := t.Context()
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4,"permanent_prefix":"bad-"}`})
	const caps = `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`
	kv, err := js.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	_, err = kv.Put(ctx, contract.PolicyDefault, []byte(caps))
	require.NoError(t, err)
	p, err := contract.DecodePolicy([]byte(caps))
	require.NoError(t, err)

	job := contract.Job{ID: contract.JobID("x", 0, false), TaskID: "x", To: cmp.Or(base.To, "user-0"), Body: "offer",
		Channel: "sandbox", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 3,
		Recheck: true, Attempts: base.Attempts, MaybeSent: base.MaybeSent}
	if want == contract.EventExpired {
		job.ExpiresAt = time.Now().Add(-time.Second).UTC()
	}
	counter, err := policy.OpenCounter(ctx, js)
	require.NoError(t, err)
	over, err := counter.Reserve(ctx, job.Channel, job.To, job.ID, contract.CategoryMarketing, p.FrequencyCaps, time.Now())
	require.NoError(t, err)
	require.Nil(t, over)
	if entry != nil {
		ledger, err := js.KeyValue(ctx, contract.BucketLedger)
		require.NoError(t, err)
		data, err := json.Marshal(entry)
		require.NoError(t, err)
		_, err = ledger.Put(ctx, job.LedgerKey(), data)
		require.NoError(t, err)
	}

	svc := runService(t, js, Config{Logger: logtest.Logger()})
	select { // started: the policy view holds the bucket's values
	case <-svc.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("dispatch did not start")
	}
	require.Eventually(t, func() bool {
		_, err := js.Consumer(ctx, contract.StreamJobs, contract.DispatchConsumer("a", contract.PriorityNormal))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the lane's consumer")
	data, err := json.Marshal(&job)
	require.NoError(t, err)
	_, err = js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)

	subject := contract.EventSubject("x", want)
	require.Eventually(t, func() bool {
		st, err := js.Stream(ctx, contract.StreamEvents)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		return err == nil && info.State.Subjects[subject] == 1
	}, 10*time.Second, 50*time.Millisecond, "the job's %s event", want)
	require.Zero(t, sentOf(t, js, "x"))
	sends, err := counter.Sends(ctx, job.Channel, job.To)
	require.NoError(t, err)
	return sends
}
