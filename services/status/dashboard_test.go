package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/metrics/metricstest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/services/status"
)

// startStatus runs the status service alone with its dashboard on a free
// port and returns the dashboard's base URL.
func startStatus(t *testing.T, ts *pipelinetest.Server, reg *prometheus.Registry) string {
	t.Helper()
	svc, err := status.New(ts.JS, status.Config{DashboardAddr: "127.0.0.1:0", PollInterval: 100 * time.Millisecond,
		Metrics: reg, Logger: logtest.Logger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	natstest.Eventually(t, 10*time.Second, func() bool { return svc.DashboardURL() != "" })
	return svc.DashboardURL()
}

func putKV(t *testing.T, ts *pipelinetest.Server, bucket, key string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, bucket)
	require.NoError(t, err)
	data, err := json.Marshal(v)
	require.NoError(t, err)
	_, err = kv.Put(ctx, key, data)
	require.NoError(t, err)
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, url)
	require.NoError(t, json.NewDecoder(res.Body).Decode(v))
}

// TestDashboardShowsKVState checks the dashboard's data path against a
// real server: progress from KV broadcast_progress, accounts with their
// health, queue depths from the account consumers, and control requests
// forwarded on broadcast.control.<task>.
func TestDashboardShowsKVState(t *testing.T) {
	t.Parallel()
	ts := pipelinetest.Start(t)
	ts.PutAccount(t, "hook-a", `{"channel":"webhook","endpoint":"http://127.0.0.1:1/send","rate_per_sec":20,"daily_cap":500}`)
	ts.PutAccount(t, "hook-b", `{"channel":"webhook","endpoint":"http://127.0.0.1:1/send","rate_per_sec":5,"enabled":false}`)
	now := time.Now().UTC()
	putKV(t, ts, contract.BucketHealth, "hook-a", contract.AccountHealth{State: contract.HealthPaused, Reason: "token revoked",
		RatePerSec: 7.5, Ceiling: 20, DailyUsed: 120, DailyCap: 500, UpdatedAt: now})
	putKV(t, ts, contract.BucketProgress, "old", contract.Progress{TaskID: "old", State: contract.StateSucceeded, Total: 2, Sent: 2, CreatedAt: now.Add(-2 * time.Hour)})
	putKV(t, ts, contract.BucketProgress, "newer-done", contract.Progress{TaskID: "newer-done", State: contract.StatePartial, Total: 2, Sent: 1, Failed: 1, CreatedAt: now.Add(-time.Hour)})
	putKV(t, ts, contract.BucketProgress, "live", contract.Progress{TaskID: "live", State: contract.StateProcessing, Total: 100, Sent: 10, CreatedAt: now.Add(-3 * time.Hour)})

	// Five jobs wait in hook-a's queue, as dispatch's consumers (one per
	// priority) would see them: three normal, two high.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []contract.Priority{contract.PriorityNormal, contract.PriorityHigh} {
		_, err := ts.JS.CreateOrUpdateConsumer(ctx, contract.StreamJobs, jetstreamConsumer("hook-a", p))
		require.NoError(t, err)
	}
	for i := range 5 {
		p := contract.PriorityNormal
		if i >= 3 {
			p = contract.PriorityHigh
		}
		_, err := ts.JS.Publish(ctx, contract.JobSubject("hook-a", p), []byte(fmt.Sprintf(`{"n":%d}`, i)))
		require.NoError(t, err)
	}

	reg := prometheus.NewRegistry()
	base := startStatus(t, ts, reg)

	var tasks struct {
		Tasks []contract.Progress `json:"tasks"`
	}
	getJSON(t, base+"api/tasks", &tasks)
	var order []string
	for _, p := range tasks.Tasks {
		order = append(order, p.TaskID)
	}
	require.Equal(t, []string{"live", "newer-done", "old"}, order, "running tasks first, then the newest")

	var accounts struct {
		Accounts []status.AccountView `json:"accounts"`
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		getJSON(t, base+"api/accounts", &accounts)
		return len(accounts.Accounts) == 2 && accounts.Accounts[0].QueueDepth == 5
	}, "hook-a's queue depth")
	a, b := accounts.Accounts[0], accounts.Accounts[1]
	require.Equal(t, "hook-a", a.Name)
	require.Equal(t, contract.HealthPaused, a.State)
	require.Equal(t, "token revoked", a.Reason)
	require.Equal(t, 7.5, a.RatePerSec)
	require.Equal(t, 20.0, a.Ceiling)
	require.Equal(t, 120, a.DailyUsed)
	require.Equal(t, 500, a.DailyCap)
	require.True(t, a.Enabled)
	require.Equal(t, status.AccountView{Name: "hook-b", Channel: "webhook", Enabled: false, State: contract.HealthHealthy, Ceiling: 5}, b)

	// A progress change reaches the API.
	putKV(t, ts, contract.BucketProgress, "live", contract.Progress{TaskID: "live", State: contract.StatePaused, Total: 100, Sent: 42, CreatedAt: now})
	natstest.Eventually(t, 5*time.Second, func() bool {
		var p contract.Progress
		getJSON(t, base+"api/tasks/live", &p)
		return p.Sent == 42 && p.State == contract.StatePaused
	})

	// The buttons go to whoever answers broadcast.control.<task>.
	sub, err := ts.NC.Subscribe(contract.ControlSubject("live"), func(m *nats.Msg) {
		var req contract.ControlRequest
		_ = json.Unmarshal(m.Data, &req)
		reply := contract.ControlReply{OK: true, State: contract.StateProcessing}
		if req.Action != contract.ActionResume {
			reply = contract.ControlReply{OK: false, Error: "cannot " + req.Action + " <b>live</b>"}
		}
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	res, err := http.Post(base+"api/tasks/live/resume", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	require.JSONEq(t, `{"ok":true,"state":"processing"}`, string(body))
	res, err = http.Post(base+"api/tasks/live/cancel", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.JSONEq(t, `{"ok":false,"error":"cannot cancel <b>live</b>"}`, string(body))
	// No one answers for another task.
	res, err = http.Post(base+"api/tasks/nobody/pause", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)

	// The polled gauges follow the same data.
	natstest.Eventually(t, 5*time.Second, func() bool {
		m := metricstest.Scrape(t, base+"metrics")
		return m.Sum("broadcast_queue_depth", "account", "hook-a") == 5 &&
			m.Sum("broadcast_account_paused", "account", "hook-a") == 1 &&
			m.Has("broadcast_account_paused", "account", "hook-b") &&
			m.Sum("broadcast_account_paused", "account", "hook-b") == 0 &&
			m.Sum("broadcast_tasks", "state", "paused") == 1 &&
			m.Sum("broadcast_tasks", "state", "succeeded") == 1 &&
			m.Sum("broadcast_tasks", "state", "processing") == 0
	}, "polled gauges")
}

// jetstreamConsumer is an account's consumer of one priority, shaped like
// dispatch's.
func jetstreamConsumer(account string, p contract.Priority) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{Durable: contract.DispatchConsumer(account, p), FilterSubject: contract.JobSubject(account, p), AckPolicy: jetstream.AckExplicitPolicy}
}
