package status

import (
	"math"
	"time"
)

// rateTau is the smoothing time constant: the rate follows changes over a
// few seconds instead of jumping with every flush.
const rateTau = 5 * time.Second

// rateMeter is an exponentially smoothed sends-per-second meter.
type rateMeter struct {
	EWMA    float64   `json:"ewma"`
	Pending int       `json:"pending"`
	Last    time.Time `json:"last"`
	First   time.Time `json:"first"`
	Total   int       `json:"total"`
	LastAdd time.Time `json:"last_add"`
}

func (m *rateMeter) add(n int) {
	m.Pending += n
	m.Total += n
	now := time.Now()
	if m.First.IsZero() {
		m.First = now
	}
	m.LastAdd = now
}

// perSecond folds what was added since the last call into the average.
func (m *rateMeter) perSecond(now time.Time) float64 {
	if m.Last.IsZero() {
		m.Last = now
		if m.First.IsZero() {
			return 0
		}
		m.Last = m.First
	}
	dt := now.Sub(m.Last)
	if dt < 100*time.Millisecond {
		return m.EWMA
	}
	inst := float64(m.Pending) / dt.Seconds()
	alpha := 1 - math.Exp(-dt.Seconds()/rateTau.Seconds())
	if m.EWMA == 0 {
		m.EWMA = inst
	} else {
		m.EWMA += alpha * (inst - m.EWMA)
	}
	m.Pending = 0
	m.Last = now
	return m.EWMA
}

// average is the mean rate from the first to the last send: what a
// finished task reports.
func (m *rateMeter) average() float64 {
	// A burst of sends within a second is that many per second, not a rate
	// extrapolated from microseconds.
	d := max(m.LastAdd.Sub(m.First).Seconds(), 1)
	return float64(m.Total) / d
}
