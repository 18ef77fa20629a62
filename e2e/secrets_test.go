package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// TestSecretsNeverLeak plants a recognisable signing secret in the
// environment of dispatch (named by the account's secret_env) and runs a
// broadcast through a provider that checks the signature and, for some
// recipients, answers with an error that echoes the secret back (retryable
// at first, then permanent for a few). Afterwards every service log line
// (all levels), every message of every stream (events, DEAD, the task and
// work queues, and every KV bucket and object store, which are streams too)
// must be free of the secret; the test also proves the secret was in play
// (valid signatures, echoed answers) and was redacted where the answers were
// recorded.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	random := make([]byte, 12)
	_, _ = rand.Read(random)
	secret := "SECRET-XYZZY-" + hex.EncodeToString(random)

	g, err := gateway.New(gateway.Config{Secret: secret, Seed: 3})
	require.NoError(t, err)
	var echoed atomic.Int64
	var mu sync.Mutex
	attempts := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		attempts[key]++
		n := attempts[key]
		mu.Unlock()
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		r.Body.Close()
		to := string(body.Bytes())
		switch {
		case strings.Contains(to, `"to":"echo-`) && n <= 2:
			// A provider that echoes what it was given when it fails.
			echoed.Add(1)
			http.Error(w, `{"error":"upstream unavailable","debug":{"token":"`+secret+`","auth":"Bearer `+secret+`"}}`, http.StatusServiceUnavailable)
			return
		case strings.Contains(to, `"to":"refuse-`):
			echoed.Add(1)
			http.Error(w, "invalid recipient for key "+secret, http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body.Bytes()))
		g.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	var logs logtest.Buffer
	cfg := harness.FastRetries()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Dispatch.Getenv = func(name string) string {
		if name == "BROADCAST_SECRET_TEST_HOOK" {
			return secret
		}
		return ""
	}
	ts.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"secret_env":"BROADCAST_SECRET_TEST_HOOK","rate_per_sec":500,"burst":20,"concurrency":8}`, srv.URL))
	pipelinetest.StartPipeline(t, ts, cfg)

	task := contract.Task{ID: "secret-1", Channel: "webhook", Template: "Hello {{.to}}", MaxAttempts: 5}
	const n, echo, refuse = 200, 20, 5
	for i := range n {
		to := fmt.Sprintf("user-%03d", i)
		switch {
		case i < echo:
			to = fmt.Sprintf("echo-%03d", i)
		case i < echo+refuse:
			to = fmt.Sprintf("refuse-%03d", i)
		}
		task.Recipients = append(task.Recipients, contract.Recipient{To: to})
	}
	harness.Submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 60*time.Second)
	l := g.Ledger()
	t.Logf("secret run: %s sent=%d failed=%d; provider answers echoing the secret: %d; signed requests accepted: %d, bad signatures: %d",
		p.State, p.Sent, p.Failed, echoed.Load(), l.Accepted, l.BadSignature)

	// The secret was in play: every accepted request carried a valid
	// signature made with it, and the provider echoed it in its errors.
	require.Equal(t, n-refuse, p.Sent)
	require.Equal(t, refuse, p.Failed)
	require.Equal(t, n-refuse, l.Accepted)
	require.Zero(t, l.BadSignature)
	require.Equal(t, int64(2*echo+refuse), echoed.Load())

	// Nowhere to be found.
	requireNoSecret(t, "service logs", logs.String(), secret)
	requireNoSecret(t, "service logs (a prefix of the secret)", logs.String(), secret[:20])
	redacted := 0
	for _, stream := range allStreams() {
		msgs := streamMessages(t, ts, stream)
		for _, m := range msgs {
			requireNoSecret(t, "stream "+stream, m, secret)
			redacted += strings.Count(m, "[redacted]")
		}
		t.Logf("stream %s: %d messages checked", stream, len(msgs))
	}
	// The echoed answers were recorded (retrying and failed events, DEAD,
	// the ledger's attempt history), with the secret cut out.
	require.Positive(t, redacted, "answers were recorded, redacted")
	evs := ts.Events(t, task.ID)
	var sawRedacted bool
	for _, e := range evs {
		sawRedacted = sawRedacted || strings.Contains(e.Error, "[redacted]")
	}
	require.True(t, sawRedacted, "an event carries the redacted answer")
	for _, d := range harness.DeadLetters(t, ts, task.ID) {
		require.Contains(t, d.Error, "invalid recipient for key [redacted]")
	}
}
