package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/contract"
)

// Dispatch is the dispatch service's metric set.
type Dispatch struct {
	sends       *prometheus.CounterVec
	retries     *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	rate        *prometheus.GaugeVec
	batchSize   *prometheus.HistogramVec
	sessions    *prometheus.CounterVec
	refresh     prometheus.Histogram

	// accounts holds each account's series of the per-send metrics
	// (accountSeries), found without the vectors' locks: with hundreds
	// of accounts sending, their first sends queued thousands of
	// goroutines behind a vector's lock while it made each account's
	// series.
	accounts sync.Map
}

// accountSeries is one account's series of the metrics recorded per send.
type accountSeries struct {
	sent        prometheus.Counter // outcome sent, class none
	rateLimited prometheus.Counter
	latency     prometheus.Observer
	rate        prometheus.Gauge
}

// latencyBuckets spans a sandbox's microseconds to a slow gateway's tens of
// seconds.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// batchSizeBuckets spans a lone retry to WxPusher's 2,000 uids per call.
var batchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}

// NewDispatch registers dispatch's metrics with reg; a nil reg gives a nil
// set.
//
//	broadcast_sends_total{account, outcome="sent|retrying|failed|expired|cancelled|skipped", class}
//	broadcast_send_duration_seconds{account}   (histogram of provider calls;
//	                                            its _count is the number of calls)
//	broadcast_batch_size{account}              (recipients per call, batch accounts only)
//	broadcast_retries_total{account, class}
//	broadcast_rate_limited_total{account}
//	broadcast_account_rate_per_sec{account}    (effective, adaptive rate)
//	broadcast_account_sessions_ended_total{cause="idle|lease_lost|reconnected|give_back|consumer_gone|stop|panic|error"}
//	broadcast_lease_refresh_seconds            (histogram of accounts' lease refreshes)
func NewDispatch(reg *prometheus.Registry) *Dispatch {
	if reg == nil {
		return nil
	}
	return &Dispatch{
		sends: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sends_total",
			Help: "Job outcomes published by dispatch, by account, outcome (event kind) and error class (none for sent).",
		}, []string{"account", "outcome", "class"})),
		retries: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "retries_total",
			Help: "Jobs scheduled for another attempt, by account and error class.",
		}, []string{"account", "class"})),
		rateLimited: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rate_limited_total",
			Help: "Rate-limit answers from providers (HTTP 429 and equivalents), by account.",
		}, []string{"account"})),
		latency: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "send_duration_seconds",
			Help:    "Provider call latency, by account.",
			Buckets: latencyBuckets,
		}, []string{"account"})),
		rate: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_rate_per_sec",
			Help: "Effective (adaptive) send rate of an account as of its last outcome; its configured rate before any.",
		}, []string{"account"})),
		batchSize: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "batch_size",
			Help:    "Recipients per provider call of batch accounts (max_batch > 1), by account.",
			Buckets: batchSizeBuckets,
		}, []string{"account"})),
		sessions: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "account_sessions_ended_total",
			Help: "Sessions of this process sending for an account that ended, by cause: idle (no work), give_back (handed to another replica), stop (the process stops); the others are failures.",
		}, []string{"cause"})),
		refresh: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "lease_refresh_seconds",
			Help:    "Time an account's lease refresh took, answered or not; the holder counts its lease valid until 3.5 s after the last confirmed refresh began.",
			Buckets: latencyBuckets,
		})),
	}
}

// Account makes account's series of the per-send metrics, if not made yet,
// so its sends look them up without the vectors' locks; dispatch calls it
// when an account is configured, so an account that has sent nothing yet
// shows zeros, and its configured rate until its first outcome.
func (m *Dispatch) Account(account string, ratePerSec float64) {
	if m == nil {
		return
	}
	if _, made := m.accounts.Load(account); made {
		return
	}
	m.series(account).rate.Set(ratePerSec)
}

func (m *Dispatch) series(account string) *accountSeries {
	if a, ok := m.accounts.Load(account); ok {
		return a.(*accountSeries)
	}
	a, _ := m.accounts.LoadOrStore(account, &accountSeries{
		sent:        m.sends.WithLabelValues(account, string(contract.EventSent), classLabel("")),
		rateLimited: m.rateLimited.WithLabelValues(account),
		latency:     m.latency.WithLabelValues(account),
		rate:        m.rate.WithLabelValues(account),
	})
	return a.(*accountSeries)
}

// SessionEnded records the end of an account's sending session and why.
func (m *Dispatch) SessionEnded(cause string) {
	if m == nil {
		return
	}
	m.sessions.WithLabelValues(cause).Inc()
}

// LeaseRefreshed records how long one lease refresh took.
func (m *Dispatch) LeaseRefreshed(d time.Duration) {
	if m == nil {
		return
	}
	m.refresh.Observe(d.Seconds())
}

// Outcome records an outcome event dispatch published.
func (m *Dispatch) Outcome(ev *contract.Event) {
	if m == nil {
		return
	}
	a := m.series(ev.Account)
	if ev.RatePerSec > 0 {
		a.rate.Set(ev.RatePerSec)
	}
	if ev.Kind == contract.EventSent && ev.Class == "" {
		a.sent.Inc()
		return
	}
	outcome := string(ev.Kind)
	switch ev.Kind {
	case contract.EventSent, contract.EventRetrying, contract.EventFailed, contract.EventExpired, contract.EventCancelled,
		contract.EventSkipped: // suppressed before the send
	default:
		outcome = "other"
	}
	class := classLabel(ev.Class)
	m.sends.WithLabelValues(ev.Account, outcome, class).Inc()
	if ev.Kind == contract.EventRetrying {
		m.retries.WithLabelValues(ev.Account, class).Inc()
	}
	if ev.Class == contract.ClassRateLimited && !ev.CallShared {
		// A batch call rate limited as a whole is one answer.
		a.rateLimited.Inc()
	}
}

// Latency records one provider call.
func (m *Dispatch) Latency(account string, d time.Duration) {
	if m == nil {
		return
	}
	m.series(account).latency.Observe(d.Seconds())
}

// BatchSize records how many recipients one call of a batch account carried.
func (m *Dispatch) BatchSize(account string, n int) {
	if m == nil {
		return
	}
	m.batchSize.WithLabelValues(account).Observe(float64(n))
}

// classLabel bounds the class label to the known error classes.
func classLabel(c contract.ErrorClass) string {
	switch c {
	case "":
		return "none"
	case contract.ClassRetryable, contract.ClassRateLimited, contract.ClassRecipientDelay, contract.ClassPermanent, contract.ClassAccountFatal:
		return string(c)
	}
	return "other"
}
