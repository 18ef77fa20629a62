package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
)

// recordingGateway is the fault-injecting gateway behind an httptest server,
// also recording when every request arrived (answered or not).
type recordingGateway struct {
	*gateway.Gateway
	URL string
	mu  sync.Mutex
	at  []time.Time
}

func startGateway(t *testing.T, cfg gateway.Config) *recordingGateway {
	t.Helper()
	g, err := gateway.New(cfg)
	require.NoError(t, err)
	rg := &recordingGateway{Gateway: g}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			rg.mu.Lock()
			rg.at = append(rg.at, time.Now())
			rg.mu.Unlock()
		}
		g.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rg.URL = srv.URL
	return rg
}

// maxInAnySecond is the largest number of requests that arrived within any
// one-second sliding window.
func (rg *recordingGateway) maxInAnySecond() int {
	rg.mu.Lock()
	ts := append([]time.Time(nil), rg.at...)
	rg.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= time.Second {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// submit publishes a task as JSON without a Nats-Msg-Id, so only ingest's
// own ledger can recognise a repeated id.
func submit(t *testing.T, ts *pipelinetest.Server, task any) {
	t.Helper()
	var data []byte
	switch v := task.(type) {
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		var err error
		data, err = json.Marshal(v)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ts.JS.Publish(ctx, contract.SubjectTasks, data)
	require.NoError(t, err)
}

// submitWithMsgID publishes raw bytes with a Nats-Msg-Id header.
func submitWithMsgID(t *testing.T, ts *pipelinetest.Server, data []byte, msgID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := nats.NewMsg(contract.SubjectTasks)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	_, err := ts.JS.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// countByKind tallies events per kind.
func countByKind(evs []contract.Event) map[contract.EventKind]int {
	out := map[contract.EventKind]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}

func gatewayOK() gateway.Config { return gateway.Config{Seed: 1} }

func (rg *recordingGateway) lastArrival() time.Time {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	var last time.Time
	for _, t := range rg.at {
		if t.After(last) {
			last = t
		}
	}
	return last
}

func (rg *recordingGateway) firstArrival() time.Time {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	var first time.Time
	for _, t := range rg.at {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}
