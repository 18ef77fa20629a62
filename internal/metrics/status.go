package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/contract"
)

// Status is the status service's metric set.
type Status struct {
	folded     *prometheus.CounterVec
	queueDepth *prometheus.GaugeVec
	inFlight   *prometheus.GaugeVec
	paused     *prometheus.GaugeVec
	score      *prometheus.GaugeVec
	quality    *prometheus.GaugeVec
	dailyCap   *prometheus.GaugeVec
	dailyUsed  *prometheus.GaugeVec
	tasks      *prometheus.GaugeVec
	trips      prometheus.Counter
	alerts     *prometheus.CounterVec
}

// NewStatus registers status's metrics with reg; a nil reg gives a nil set.
//
//	broadcast_events_folded_total{kind}
//	broadcast_queue_depth{account}        (JOBS consumers of the account, every priority: not yet delivered)
//	broadcast_queue_in_flight{account}    (delivered, not yet acknowledged)
//	broadcast_account_paused{account}     (1 when KV broadcast_health says paused)
//	broadcast_account_health_score{account} (0-100, KV broadcast_scores)
//	broadcast_account_quality{account,rating} (1 for the account's quality rating)
//	broadcast_account_daily_cap{account}  (its effective cap: daily_cap, warm-up, messaging limit; 0 none)
//	broadcast_account_daily_used{account} (distinct recipients in the rolling 24 h)
//	broadcast_tasks{state}                (tasks in KV broadcast_progress by state)
//	broadcast_circuit_breaker_trips_total (tasks the circuit breaker paused)
//	broadcast_alerts_total{result}        (operator alerts: sent, suppressed, failed, dropped)
func NewStatus(reg *prometheus.Registry) *Status {
	if reg == nil {
		return nil
	}
	return &Status{
		folded: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_folded_total",
			Help: "Events folded into progress by status, by kind (a redelivered event counts again).",
		}, []string{"kind"})),
		queueDepth: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "queue_depth",
			Help: "Jobs waiting in an account's JOBS consumer, not yet delivered (polled).",
		}, []string{"account"})),
		inFlight: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "queue_in_flight",
			Help: "Jobs delivered to dispatch and not yet acknowledged, per account (polled).",
		}, []string{"account"})),
		paused: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_paused",
			Help: "1 when the account is paused by an account-fatal answer, else 0.",
		}, []string{"account"})),
		score: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_health_score",
			Help: "Account health score 0-100 over the last hour (delivery rate, blocks, 429 share, quality).",
		}, []string{"account"})),
		quality: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_quality",
			Help: "1 for the account's quality rating as the provider reports it (GREEN, YELLOW, RED, UNKNOWN).",
		}, []string{"account", "rating"})),
		dailyCap: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_daily_cap",
			Help: "The account's effective daily cap (lowest of daily_cap, warm-up and messaging limit); 0 for none.",
		}, []string{"account"})),
		dailyUsed: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "account_daily_used",
			Help: "Distinct recipients the account reached in the rolling 24 h.",
		}, []string{"account"})),
		tasks: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "tasks",
			Help: "Tasks in KV broadcast_progress by state.",
		}, []string{"state"})),
		trips: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "circuit_breaker_trips_total",
			Help: "Tasks the per-task circuit breaker paused.",
		})),
		alerts: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "alerts_total",
			Help: "Operator alerts (ALERT_URL) by result: sent, suppressed (one per subject per interval), failed, dropped.",
		}, []string{"result"})),
	}
}

// Tripped counts one task paused by the circuit breaker.
func (m *Status) Tripped() {
	if m == nil {
		return
	}
	m.trips.Inc()
}

// Alert counts one operator alert with its result.
func (m *Status) Alert(result string) {
	if m == nil {
		return
	}
	m.alerts.WithLabelValues(result).Inc()
}

// Folded counts one event folded.
func (m *Status) Folded(kind contract.EventKind) {
	if m == nil {
		return
	}
	k := string(kind)
	switch kind {
	case contract.EventAccepted, contract.EventRejected, contract.EventSent, contract.EventRetrying,
		contract.EventFailed, contract.EventSkipped, contract.EventExpired, contract.EventCancelled,
		contract.EventDelivered, contract.EventRead, contract.EventUndelivered:
	default:
		k = "other"
	}
	m.folded.WithLabelValues(k).Inc()
}

// AccountGauges is one account's polled values.
type AccountGauges struct {
	Name       string
	QueueDepth uint64
	InFlight   int
	Paused     bool
	// Score is the health score, -1 when none is written yet.
	Score     int
	Quality   string
	DailyCap  int
	DailyUsed int
}

// SetAccounts replaces the per-account gauges: accounts not in the list
// disappear, so a deleted account's last values do not linger.
func (m *Status) SetAccounts(accounts []AccountGauges) {
	if m == nil {
		return
	}
	m.queueDepth.Reset()
	m.inFlight.Reset()
	m.paused.Reset()
	m.score.Reset()
	m.quality.Reset()
	m.dailyCap.Reset()
	m.dailyUsed.Reset()
	for _, a := range accounts {
		if a.Score >= 0 {
			m.score.WithLabelValues(a.Name).Set(float64(a.Score))
		}
		q := a.Quality
		if q == "" {
			q = contract.QualityUnknown
		}
		m.quality.WithLabelValues(a.Name, q).Set(1)
		m.dailyCap.WithLabelValues(a.Name).Set(float64(a.DailyCap))
		m.dailyUsed.WithLabelValues(a.Name).Set(float64(a.DailyUsed))
		m.queueDepth.WithLabelValues(a.Name).Set(float64(a.QueueDepth))
		m.inFlight.WithLabelValues(a.Name).Set(float64(a.InFlight))
		p := 0.0
		if a.Paused {
			p = 1
		}
		m.paused.WithLabelValues(a.Name).Set(p)
	}
}

// SetTasks sets the number of tasks per state; states absent from counts
// are zero.
func (m *Status) SetTasks(counts map[contract.TaskState]int) {
	if m == nil {
		return
	}
	for _, s := range []contract.TaskState{contract.StatePending, contract.StateScheduled, contract.StateAwaitingApproval,
		contract.StateProcessing, contract.StatePaused, contract.StateSucceeded, contract.StatePartial,
		contract.StateFailed, contract.StateCancelled, contract.StateRejected} {
		m.tasks.WithLabelValues(string(s)).Set(float64(counts[s]))
	}
}
