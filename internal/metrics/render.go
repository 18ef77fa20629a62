package metrics

import "github.com/prometheus/client_golang/prometheus"

// Render is the render service's metric set.
type Render struct {
	rendered prometheus.Counter
	skipped  *prometheus.CounterVec
}

// NewRender registers render's metrics with reg; a nil reg gives a nil set.
//
//	broadcast_jobs_rendered_total
//	broadcast_jobs_skipped_total{reason="invalid_recipient|template|body"}
func NewRender(reg *prometheus.Registry) *Render {
	if reg == nil {
		return nil
	}
	return &Render{
		rendered: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "jobs_rendered_total",
			Help: "Jobs rendered and enqueued for dispatch (a redelivered batch counts again).",
		})),
		skipped: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "jobs_skipped_total",
			Help: "Recipients skipped at render time, by reason.",
		}, []string{"reason"})),
	}
}

// Rendered counts n jobs enqueued.
func (m *Render) Rendered(n int) {
	if m == nil || n == 0 {
		return
	}
	m.rendered.Add(float64(n))
}

// Skipped counts n recipients skipped for reason (the skipped event's code).
func (m *Render) Skipped(reason string, n int) {
	if m == nil || n == 0 {
		return
	}
	switch reason {
	case "invalid_recipient", "template", "body":
	default:
		reason = "other"
	}
	m.skipped.WithLabelValues(reason).Add(float64(n))
}
