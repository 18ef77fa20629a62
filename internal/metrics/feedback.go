package metrics

import "github.com/prometheus/client_golang/prometheus"

// Feedback is the feedback service's metric set.
type Feedback struct {
	refused  *prometheus.CounterVec
	receipts *prometheus.CounterVec
	indexed  prometheus.Counter
}

// Reasons a feedback route refuses a request, counted by Feedback.Refused.
const (
	RefusedUnsigned     = "unsigned"
	RefusedBadSignature = "bad_signature"
	RefusedUnauthorized = "unauthorized"
	RefusedTooLarge     = "too_large"
	RefusedBadRequest   = "bad_request"
	RefusedUnavailable  = "unavailable"
)

// What became of a receipt, counted by Feedback.Receipt.
const (
	ReceiptStored    = "stored"
	ReceiptEvent     = "event"
	ReceiptUnmatched = "unmatched"
	ReceiptIgnored   = "ignored"
)

// NewFeedback registers feedback's metrics with reg; a nil reg gives a nil set.
//
//	broadcast_feedback_refused_total{route,reason}
//	broadcast_feedback_receipts_total{source,result}
//	broadcast_feedback_indexed_total
func NewFeedback(reg *prometheus.Registry) *Feedback {
	if reg == nil {
		return nil
	}
	m := &Feedback{
		refused: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "feedback_refused_total",
			Help: "Webhook requests feedback refused, by route and reason (unsigned, bad_signature, unauthorized, too_large, bad_request, unavailable).",
		}, []string{"route", "reason"})),
		receipts: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "feedback_receipts_total",
			Help: "Receipts by source and result: stored (accepted from a provider), event (matched and published), unmatched (no sent event found in time), ignored (a status with no event: sent, soft bounce).",
		}, []string{"source", "result"})),
		indexed: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "feedback_indexed_total",
			Help: "Sent events whose provider ids feedback indexed.",
		})),
	}
	for _, route := range []string{"whatsapp", "receipts", "bounce"} {
		for _, r := range []string{RefusedUnsigned, RefusedBadSignature, RefusedUnauthorized, RefusedTooLarge, RefusedBadRequest} {
			m.refused.WithLabelValues(route, r) // show zeros from the start
		}
	}
	return m
}

// Refused counts one request refused on route for reason.
func (m *Feedback) Refused(route, reason string) {
	if m == nil {
		return
	}
	m.refused.WithLabelValues(route, reason).Inc()
}

// Receipt counts n receipts of source with result.
func (m *Feedback) Receipt(source, result string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.receipts.WithLabelValues(source, result).Add(float64(n))
}

// Indexed counts one sent event indexed.
func (m *Feedback) Indexed() {
	if m == nil {
		return
	}
	m.indexed.Inc()
}
