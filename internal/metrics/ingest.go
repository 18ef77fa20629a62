package metrics

import "github.com/prometheus/client_golang/prometheus"

// Task submission results counted by Ingest.Task.
const (
	TaskAccepted    = "accepted"
	TaskRejected    = "rejected"
	TaskDuplicateID = "duplicate_id"
)

// Ingest is the ingest service's metric set.
type Ingest struct {
	tasks *prometheus.CounterVec
}

// NewIngest registers ingest's metrics with reg; a nil reg gives a nil set.
//
//	broadcast_tasks_total{result="accepted|rejected|duplicate_id"}
func NewIngest(reg *prometheus.Registry) *Ingest {
	if reg == nil {
		return nil
	}
	m := &Ingest{
		tasks: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tasks_total",
			Help: "Task submissions by result: accepted, rejected (invalid), duplicate_id (id seen before, ignored).",
		}, []string{"result"})),
	}
	for _, r := range []string{TaskAccepted, TaskRejected, TaskDuplicateID} {
		m.tasks.WithLabelValues(r) // show zeros from the start
	}
	return m
}

// Task counts one submission with its result (TaskAccepted, TaskRejected
// or TaskDuplicateID).
func (m *Ingest) Task(result string) {
	if m == nil {
		return
	}
	m.tasks.WithLabelValues(result).Inc()
}
