package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/metrics/metricstest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/feedback"
	"github.com/broadcastd/broadcast/shared"
)

// feedbackStack is the pipeline under nats.conf's users plus feedback,
// connected as its own user the way `broadcast feedback` connects.
type feedbackStack struct {
	cs   *pipelinetest.ConfigServer
	fb   *feedback.Service
	reg  *prometheus.Registry
	post *feedbacktest.Poster
	// stop stops fb and waits until it ended.
	stop func()
	// restart starts a new feedback service in fb's place (stop first).
	restart func(t *testing.T)
}

// startFeedbackStack starts the stack; secrets are what dispatch and
// feedback read for the accounts' variables.
func startFeedbackStack(t *testing.T, secrets map[string]string, tune func(*feedback.Config)) *feedbackStack {
	t.Helper()
	cs, users, _ := startSecureServer(t, natstest.ConfigOptions{})
	cfg := harness.WithSecrets(secrets)
	cfg.Users = users
	pipelinetest.StartPipeline(t, cs.Server, cfg)
	st := &feedbackStack{cs: cs}
	st.restart = func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		creds := users["feedback"]
		nc, js, err := shared.ConnectService(ctx, shared.NATSConfig{URL: cs.URL, User: creds.User, Password: creds.Password}, "feedback", logtest.Logger())
		require.NoError(t, err, "feedback starts as its user against the topology admin created")
		t.Cleanup(nc.Close)
		reg := metrics.NewRegistry()
		fc := feedback.Config{Addr: "127.0.0.1:0", Token: "bounce-token", Getenv: func(n string) string { return secrets[n] },
			MatchWait: 3 * time.Second, MatchRetry: 20 * time.Millisecond, Metrics: reg, Logger: logtest.Logger()}
		if tune != nil {
			tune(&fc)
		}
		fb, err := feedback.New(js, fc)
		require.NoError(t, err)
		rctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := fb.Run(rctx); err != nil {
				t.Errorf("feedback stopped: %v", err)
			}
		}()
		var once sync.Once
		st.stop = func() { once.Do(func() { stop(); <-done }) }
		t.Cleanup(st.stop)
		natstest.Eventually(t, 10*time.Second, func() bool { return fb.Addr() != "" }, "feedback listens")
		st.fb, st.reg, st.post = fb, reg, &feedbacktest.Poster{BaseURL: "http://" + fb.Addr()}
	}
	st.restart(t)
	return st
}

// samples reads feedback's metrics from its registry.
func (s *feedbackStack) samples(t *testing.T) metricstest.Samples {
	t.Helper()
	fams, err := s.reg.Gather()
	require.NoError(t, err)
	out := metricstest.Samples{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// postOK posts and requires the answer code.
func (s *feedbackStack) postCode(t *testing.T, path string, headers map[string]string, body []byte, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, err := s.post.Post(ctx, path, headers, body)
	require.NoError(t, err)
	require.Equal(t, want, code, "POST %s", path)
}

// hookGateway is a webhook gateway that checks dispatch's signature and
// records each Idempotency-Key with its recipient.
type hookGateway struct {
	*httptest.Server
	mu   sync.Mutex
	keys map[string]string
}

func startHookGateway(t *testing.T, secret string) *hookGateway {
	g := &hookGateway{keys: map[string]string{}}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			To string `json:"to"`
		}
		raw, _ := io.ReadAll(r.Body)
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(raw)
		if r.Header.Get("X-Broadcast-Signature") != "sha256="+hex.EncodeToString(mac.Sum(nil)) || json.Unmarshal(raw, &body) != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		g.mu.Lock()
		g.keys[r.Header.Get("Idempotency-Key")] = body.To
		g.mu.Unlock()
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(g.Close)
	return g
}

// graphStandIn is a WhatsApp Cloud API stand-in: it answers each send with
// a wamid (with '=' and '+' in it, as real ones have) and calls early, when
// set, before answering: a receipt that races ahead of the sent event.
type graphStandIn struct {
	*httptest.Server
	mu     sync.Mutex
	wamids map[string]string // recipient -> wamid
	early  func(to, wamid string)
}

func startGraphStandIn(t *testing.T, phoneNumberID, token string) *graphStandIn {
	g := &graphStandIn{wamids: map[string]string{}}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v21.0/"+phoneNumberID+"/messages" || r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"Invalid OAuth access token","type":"OAuthException","code":190}}`)
			return
		}
		var req struct {
			To string `json:"to"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		wamid := "wamid.HBgM" + strings.TrimPrefix(req.To, "+") + "FQIAERgS+x=="
		g.mu.Lock()
		g.wamids[req.To] = wamid
		early := g.early
		g.mu.Unlock()
		if early != nil {
			early(req.To, wamid)
		}
		fmt.Fprintf(w, `{"messaging_product":"whatsapp","contacts":[{"input":%q,"wa_id":%q}],"messages":[{"id":%q}]}`,
			req.To, strings.TrimPrefix(req.To, "+"), wamid)
	}))
	t.Cleanup(g.Close)
	return g
}

// receiptRank orders receipt statuses as status folds them.
func receiptRank(status string) int {
	switch status {
	case "failed":
		return 1
	case "delivered":
		return 2
	case "read":
		return 3
	}
	return 0
}

// expectedReceipts applies the fold's rule (per recipient the maximum of
// undelivered < delivered < read) to what was posted: delivered, read,
// undelivered counts.
func expectedReceipts(posted map[int][]string) (delivered, read, undelivered int) {
	for _, sts := range posted {
		best := 0
		for _, s := range sts {
			best = max(best, receiptRank(s))
		}
		switch best {
		case 1:
			undelivered++
		case 2:
			delivered++
		case 3:
			delivered++
			read++
		}
	}
	return
}
