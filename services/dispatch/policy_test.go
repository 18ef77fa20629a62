package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/policy"
)

// TestExpiredJobReleasesAnEarlierReservation plays a dispatch killed
// after a job reserved its send under a frequency cap and before the call:
// the job's next delivery finds it expired, sends nothing, and releases
// the reservation, so the recipient's slot is free again
// (releaseEarlierFrequency; docs/policy.md, rule 4).
func TestExpiredJobReleasesAnEarlierReservation(t *testing.T) {
	t.Parallel()
	js := topologyJS(t)
	ctx := t.Context()
	putAccounts(t, js, map[string]string{"a": `{"channel":"sandbox","rate_per_sec":100,"burst":10,"concurrency":4}`})
	const caps = `{"frequency_caps":[{"category":"marketing","max":1,"window":"24h"}]}`
	kv, err := js.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	_, err = kv.Put(ctx, contract.PolicyDefault, []byte(caps))
	require.NoError(t, err)
	p, err := contract.DecodePolicy([]byte(caps))
	require.NoError(t, err)

	job := contract.Job{ID: contract.JobID("x", 0, false), TaskID: "x", To: "user-0", Body: "offer",
		Channel: "sandbox", Account: "a", Priority: contract.PriorityNormal, MaxAttempts: 3,
		Recheck: true, ExpiresAt: time.Now().Add(-time.Second).UTC()}
	counter, err := policy.OpenCounter(ctx, js)
	require.NoError(t, err)
	over, err := counter.Reserve(ctx, job.Channel, job.To, job.ID, contract.CategoryMarketing, p.FrequencyCaps, time.Now())
	require.NoError(t, err)
	require.Nil(t, over)

	svc := runService(t, js, Config{Logger: logtest.Logger()})
	select { // started: the policy view holds the bucket's values
	case <-svc.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("dispatch did not start")
	}
	data, err := json.Marshal(&job)
	require.NoError(t, err)
	_, err = js.Publish(ctx, contract.JobSubject("a", contract.PriorityNormal), data)
	require.NoError(t, err)

	expired := contract.EventSubject("x", contract.EventExpired)
	require.Eventually(t, func() bool {
		st, err := js.Stream(ctx, contract.StreamEvents)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(expired))
		return err == nil && info.State.Subjects[expired] == 1
	}, 10*time.Second, 50*time.Millisecond, "the job's expired event")
	sends, err := counter.Sends(ctx, job.Channel, job.To)
	require.NoError(t, err)
	require.Empty(t, sends, "the expired job's reservation is released")
	require.Zero(t, sentOf(t, js, "x"))
}
