package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/feedback"
	"github.com/broadcastd/broadcast/shared"
)

// BenchmarkFeedbackReceipts measures the receipts per second feedback
// sustains on this machine: WhatsApp's three statuses per message (sent,
// delivered, read), each its own signed POST as Meta sends them, from 32
// posters at once, against an embedded server, with the messages' sent
// events indexed first (as dispatch would have published them). It reports
// posts answered per second (each delivered and read stored in RECEIPTS
// before its 200) and, end to end, receipts turned into events per second.
// status is not running: the figure is feedback's own.
//
//	nice -n 10 go test ./e2e -run '^$' -bench BenchmarkFeedbackReceipts -benchtime 1x
func BenchmarkFeedbackReceipts(b *testing.B) {
	const (
		messages = 5000
		posters  = 32
		pnid     = "106540352242922"
		app      = "bench-app-secret"
	)
	ts := pipelinetest.Start(b)
	ts.PutAccount(b, "wa", fmt.Sprintf(`{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA","phone_number_id":%q,"app_secret_env":"BROADCAST_SECRET_WA_APP"}`, pnid))
	for range b.N {
		fb, err := feedback.New(ts.JS, feedback.Config{Addr: "127.0.0.1:0", Getenv: func(string) string { return app },
			Logger: logtest.Logger()})
		require.NoError(b, err)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = fb.Run(ctx) }()
		natstest.Eventually(b, 10*time.Second, func() bool { return fb.Addr() != "" }, "feedback listens")

		task := fmt.Sprintf("bench-%d", time.Now().UnixNano())
		for i := range messages {
			ev := &contract.Event{TaskID: task, JobID: contract.JobID(task, i, false), Index: i, Account: "wa",
				Kind: contract.EventSent, Attempt: 1, ProviderID: fmt.Sprintf("wamid.HBgM%s%06dFQIAERgS=", task, i)}
			_, err := shared.PublishEventAsync(ts.JS, ev)
			require.NoError(b, err)
		}
		select {
		case <-ts.JS.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			b.Fatal("sent events not stored")
		}
		natstest.Eventually(b, 60*time.Second, func() bool { return fb.Stats().Indexed == messages }, "sent events indexed")

		type post struct{ body []byte }
		work := make(chan post, posters)
		poster := &feedbacktest.Poster{BaseURL: "http://" + fb.Addr(), Client: &http.Client{Timeout: 10 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: posters}}}
		var wg sync.WaitGroup
		for range posters {
			wg.Go(func() {
				for p := range work {
					code, _, err := poster.Post(ctx, "/webhooks/whatsapp", map[string]string{"X-Hub-Signature-256": feedbacktest.Sign([]byte(app), p.body)}, p.body)
					if err != nil || code != http.StatusOK {
						b.Errorf("post: %d %v", code, err)
					}
				}
			})
		}
		b.ResetTimer()
		start := time.Now()
		for _, status := range []string{"sent", "delivered", "read"} {
			for i := range messages {
				work <- post{feedbacktest.WhatsAppPayload(pnid, feedbacktest.WhatsAppStatus{
					ID: fmt.Sprintf("wamid.HBgM%s%06dFQIAERgS=", task, i), Status: status, RecipientID: "8613800000000"})}
			}
		}
		close(work)
		wg.Wait()
		answered := time.Since(start)
		natstest.Eventually(b, 120*time.Second, func() bool { return fb.Stats().Published == 2*messages }, "events published")
		processed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(3*messages)/answered.Seconds(), "posts/s")
		b.ReportMetric(float64(2*messages)/processed.Seconds(), "events/s")
		b.Logf("%d messages: %d posts answered in %s (%.0f/s), %d delivered+read events published after %s (%.0f/s)",
			messages, 3*messages, answered.Round(time.Millisecond), float64(3*messages)/answered.Seconds(),
			2*messages, processed.Round(time.Millisecond), float64(2*messages)/processed.Seconds())
		stop()
		<-done
	}
}
