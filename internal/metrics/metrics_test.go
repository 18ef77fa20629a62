package metrics

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func TestNilSetsRecordNothing(t *testing.T) {
	t.Parallel()
	require.Nil(t, NewIngest(nil))
	require.Nil(t, NewRender(nil))
	require.Nil(t, NewDispatch(nil))
	require.Nil(t, NewStatus(nil))
	// None of these may panic: services built without a registry call them.
	var i *Ingest
	i.Task(TaskAccepted)
	var r *Render
	r.Rendered(3)
	r.Skipped("template", 1)
	var d *Dispatch
	d.Outcome(&contract.Event{Kind: contract.EventSent})
	d.Latency("a", time.Second)
	d.Account("a", 1)
	var s *Status
	s.Folded(contract.EventSent)
	s.SetAccounts([]AccountGauges{{Name: "a"}})
	s.SetTasks(nil)
}

func TestDispatchOutcomes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	d := NewDispatch(reg)
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventSent, RatePerSec: 40})
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventSent, RatePerSec: 20})
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventRetrying, Class: contract.ClassRateLimited})
	// The other recipients of a batch call rate limited as a whole: one answer.
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventRetrying, Class: contract.ClassRateLimited, CallShared: true})
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventRetrying, Class: contract.ClassRetryable})
	d.Outcome(&contract.Event{Account: "b", Kind: contract.EventFailed, Class: contract.ClassPermanent})
	d.Outcome(&contract.Event{Account: "b", Kind: "strange", Class: "made-up"})
	d.Latency("a", 30*time.Millisecond)
	d.Latency("a", 2*time.Second)
	d.BatchSize("a", 2000)
	d.BatchSize("a", 3)

	require.Equal(t, 2.0, value(t, d.sends.WithLabelValues("a", "sent", "none")))
	require.Equal(t, 2.0, value(t, d.sends.WithLabelValues("a", "retrying", "rate_limited")))
	require.Equal(t, 1.0, value(t, d.sends.WithLabelValues("b", "failed", "permanent")))
	require.Equal(t, 1.0, value(t, d.sends.WithLabelValues("b", "other", "other")), "unknown kinds and classes are bounded")
	require.Equal(t, 2.0, value(t, d.retries.WithLabelValues("a", "rate_limited")))
	require.Equal(t, 1.0, value(t, d.retries.WithLabelValues("a", "retryable")))
	require.Equal(t, 1.0, value(t, d.rateLimited.WithLabelValues("a")))
	require.Equal(t, 20.0, value(t, d.rate.WithLabelValues("a")), "the last effective rate")
	var h dto.Metric
	require.NoError(t, d.latency.WithLabelValues("a").(prometheus.Metric).Write(&h))
	require.Equal(t, uint64(2), h.GetHistogram().GetSampleCount())
	require.InDelta(t, 2.03, h.GetHistogram().GetSampleSum(), 1e-9)
	var b dto.Metric
	require.NoError(t, d.batchSize.WithLabelValues("a").(prometheus.Metric).Write(&b))
	require.Equal(t, uint64(2), b.GetHistogram().GetSampleCount())
	require.InDelta(t, 2003, b.GetHistogram().GetSampleSum(), 1e-9)
	// Each account's sent series exists from its first outcome on, 0 for b
	// (counted before WithLabelValues, which would make it).
	require.Equal(t, 6, series(d.sends))
	require.Equal(t, 0.0, value(t, d.sends.WithLabelValues("b", "sent", "none")))
	// A configured account shows its series before it sends, its rate the
	// configured one; a batch size only once it has made a batch call.
	d.Account("c", 15)
	require.Equal(t, 7, series(d.sends))
	require.Equal(t, 1, series(d.batchSize))
	require.Equal(t, 0.0, value(t, d.sends.WithLabelValues("c", "sent", "none")))
	require.Equal(t, 0.0, value(t, d.rateLimited.WithLabelValues("c")))
	require.Equal(t, 15.0, value(t, d.rate.WithLabelValues("c")))
	// Configured again (an edit), its rate as of its last outcome stays.
	d.Account("a", 99)
	require.Equal(t, 20.0, value(t, d.rate.WithLabelValues("a")))
}

func TestOneRegistryManyServices(t *testing.T) {
	t.Parallel()
	reg := NewRegistry()
	i, r, d, s := NewIngest(reg), NewRender(reg), NewDispatch(reg), NewStatus(reg)
	// A second service of a kind shares the first one's collectors.
	d2 := NewDispatch(reg)
	d.Outcome(&contract.Event{Account: "a", Kind: contract.EventSent})
	d2.Outcome(&contract.Event{Account: "a", Kind: contract.EventSent})
	require.Equal(t, 2.0, value(t, d.sends.WithLabelValues("a", "sent", "none")))

	i.Task(TaskRejected)
	r.Rendered(5)
	r.Skipped("body", 2)
	r.Skipped("who-knows", 1)
	s.Folded(contract.EventAccepted)
	s.SetAccounts([]AccountGauges{{Name: "a", QueueDepth: 9, InFlight: 2, Paused: true}, {Name: "b"}})
	s.SetAccounts([]AccountGauges{{Name: "a", QueueDepth: 4}})
	s.SetTasks(map[contract.TaskState]int{contract.StateProcessing: 2})

	require.Equal(t, 1.0, value(t, i.tasks.WithLabelValues(TaskRejected)))
	require.Equal(t, 0.0, value(t, i.tasks.WithLabelValues(TaskAccepted)))
	require.Equal(t, 5.0, value(t, r.rendered))
	require.Equal(t, 2.0, value(t, r.skipped.WithLabelValues("body")))
	require.Equal(t, 1.0, value(t, r.skipped.WithLabelValues("other")))
	require.Equal(t, 4.0, value(t, s.queueDepth.WithLabelValues("a")))
	require.Equal(t, 1, series(s.queueDepth), "a vanished account's gauge goes away")
	require.Equal(t, 0.0, value(t, s.paused.WithLabelValues("a")))
	require.Equal(t, 10, series(s.tasks), "every state is reported")
	require.Equal(t, 2.0, value(t, s.tasks.WithLabelValues("processing")))

	fams, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, want := range []string{"broadcast_tasks_total", "broadcast_jobs_rendered_total", "broadcast_jobs_skipped_total",
		"broadcast_sends_total", "broadcast_events_folded_total", "broadcast_queue_depth", "broadcast_tasks",
		"go_goroutines", "process_cpu_seconds_total"} {
		require.True(t, names[want], want)
	}
}

func TestServe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	reg := prometheus.NewRegistry()
	NewIngest(reg).Task(TaskAccepted)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, addr, reg, slog.New(slog.DiscardHandler)) }()
	var res *http.Response
	require.Eventually(t, func() bool {
		res, err = http.Get("http://" + addr + "/metrics")
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	cancel()
	require.NoError(t, <-done)

	// A taken address is an error, not a silent no-op.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	require.ErrorContains(t, Serve(context.Background(), ln.Addr().String(), reg, slog.New(slog.DiscardHandler)), "listen")
}

// value reads a counter's or gauge's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	require.NoError(t, m.Write(&d))
	if d.Counter != nil {
		return d.GetCounter().GetValue()
	}
	return d.GetGauge().GetValue()
}

// series counts the series a collector has.
func series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	n := 0
	for range ch {
		n++
	}
	return n
}
