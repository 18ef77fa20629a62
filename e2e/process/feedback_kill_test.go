package process

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/proctest"
)

// TestKillFeedbackDuringReceiptStorm sends a 1,000-recipient webhook
// broadcast with every service a process, then posts its receipts (1,400,
// shuffled, from 16 posters at once) to feedback and kills feedback
// (SIGKILL) twice in the middle of the storm, restarting it on the same
// port. The posters retry what failed or got no answer, as providers do.
// Nothing may be lost or counted twice: progress must equal exactly what
// the posters had answered 200, with one event per recipient and kind.
func TestKillFeedbackDuringReceiptStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the multi-process kill test")
	}
	const (
		n      = 1000
		secret = "storm-signing-secret"
		kills  = 2
	)
	st := startStack(t, 0, 4)
	secretEnv := "BROADCAST_SECRET_STORM=" + secret
	st.startAll("ingest", "render", "status")
	st.start("dispatch", secretEnv)
	port := proctest.FreePort(t)
	fbURL := "http://127.0.0.1:" + strconv.Itoa(port)
	fb := st.start("feedback", secretEnv, fmt.Sprintf("FEEDBACK_ADDR=127.0.0.1:%d", port))
	st.c.putAccount("hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"secret_env":"BROADCAST_SECRET_STORM","rate_per_sec":1000,"min_rate_per_sec":1000,"burst":50,"concurrency":16}`, st.gw.URL+"/send"))
	task := contract.Task{ID: "storm", Channel: "webhook", Template: "Hello {{.to}}", Recipients: pipelinetest.Recipients("s", n)}
	st.c.submitTask(task)
	p := st.c.pollProgress(task.ID, time.Now().Add(90*time.Second), func(p *contract.Progress) bool { return p.State.Final() })
	require.Equal(t, contract.StateSucceeded, p.State)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := gateway.FetchLedger(ctx, st.gw.URL)
	cancel()
	require.NoError(t, err)
	require.Len(t, l.AcceptedByKey, n)

	// Receipts by index i%5: delivered; delivered and read; failed;
	// read; failed and delivered.
	type receipt struct {
		index  int
		status string
		body   []byte
	}
	var receipts []receipt
	for key := range l.AcceptedByKey {
		_, i, _, err := contract.ParseJobID(key)
		require.NoError(t, err)
		sts := [][]string{{"delivered"}, {"delivered", "read"}, {"failed"}, {"read"}, {"failed", "delivered"}}[i%5]
		for _, s := range sts {
			code := ""
			if s == "failed" {
				code = "451"
			}
			receipts = append(receipts, receipt{i, s, feedbacktest.WebhookReceipt(key, s, code, "gateway says so", time.Now())})
		}
	}
	rand.New(rand.NewPCG(9, 9)).Shuffle(len(receipts), func(i, j int) { receipts[i], receipts[j] = receipts[j], receipts[i] })

	poster := &feedbacktest.Poster{BaseURL: fbURL, Client: &http.Client{Timeout: 2 * time.Second}, Retry: 100 * time.Millisecond}
	var answered, retried atomic.Int64
	var mu sync.Mutex
	posted := map[int]map[string]bool{}
	work := make(chan receipt)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for r := range work {
				pctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				code, tries, err := poster.Post(pctx, "/webhooks/receipts", map[string]string{"X-Broadcast-Account": "hook",
					"X-Broadcast-Signature": feedbacktest.Sign([]byte(secret), r.body)}, r.body)
				cancel()
				if err != nil || code != http.StatusOK {
					t.Errorf("receipt %d %s: answer %d after %d tries: %v", r.index, r.status, code, tries, err)
					continue
				}
				retried.Add(int64(tries - 1))
				answered.Add(1)
				mu.Lock()
				if posted[r.index] == nil {
					posted[r.index] = map[string]bool{}
				}
				posted[r.index][r.status] = true
				mu.Unlock()
			}
		})
	}
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for k := range kills {
			want := int64((k + 1) * len(receipts) / (kills + 2))
			for answered.Load() < want {
				time.Sleep(5 * time.Millisecond)
			}
			fb.Kill()
			t.Logf("kill %d of feedback after %d receipts answered", k+1, answered.Load())
			time.Sleep(300 * time.Millisecond)
			fb.Restart()
		}
	}()
	start := time.Now()
	for _, r := range receipts {
		work <- r
	}
	close(work)
	wg.Wait()
	<-killed
	t.Logf("%d receipts answered 200 in %s, %d posts retried (no answer or refused while feedback was down)",
		answered.Load(), time.Since(start).Round(time.Millisecond), retried.Load())
	require.Equal(t, int64(len(receipts)), answered.Load())
	require.Positive(t, retried.Load(), "the kills made posters retry")
	require.Equal(t, kills+1, fb.Starts())

	var delivered, read, undelivered int
	wantEvents := map[contract.EventKind]int{}
	for _, sts := range posted {
		switch {
		case sts["read"]:
			delivered++
			read++
		case sts["delivered"]:
			delivered++
		case sts["failed"]:
			undelivered++
		}
		for s := range sts {
			wantEvents[map[string]contract.EventKind{"delivered": contract.EventDelivered, "read": contract.EventRead, "failed": contract.EventUndelivered}[s]]++
		}
	}
	require.Equal(t, [3]int{800, 400, 200}, [3]int{delivered, read, undelivered}, "what the posters had answered 200")
	p = st.c.pollProgress(task.ID, time.Now().Add(60*time.Second), func(p *contract.Progress) bool {
		return p.Delivered == delivered && p.Read == read && p.Undelivered == undelivered
	})
	require.Equal(t, [3]int{delivered, read, undelivered}, [3]int{p.Delivered, p.Read, p.Undelivered})
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, n, p.Sent)
	// Progress can be whole before every event is: a receipt weaker than
	// one folded already (a failure after a delivery) changes no count,
	// and one feedback was handling when killed comes back after the
	// receipts consumer's ack wait (10 s).
	kinds := []contract.EventKind{contract.EventDelivered, contract.EventRead, contract.EventUndelivered}
	var got map[contract.EventKind]int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got = st.c.eventKinds(task.ID)
		if slices.IndexFunc(kinds, func(k contract.EventKind) bool { return got[k] != wantEvents[k] }) < 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, k := range kinds {
		require.Equal(t, wantEvents[k], got[k], "%s events", k)
	}
}

// eventKinds counts a task's stored events by kind (the last token of
// their subjects), from the stream's per-subject counts.
func (c *chaosClient) eventKinds(taskID string) map[contract.EventKind]int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, contract.StreamEvents)
	require.NoError(c.t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(contract.SubjectEventsPrefix+taskID+".>"))
	require.NoError(c.t, err)
	out := map[contract.EventKind]int{}
	for subject, n := range info.State.Subjects {
		out[contract.EventKind(subject[len(contract.SubjectEventsPrefix+taskID+"."):])] += int(n)
	}
	return out
}
