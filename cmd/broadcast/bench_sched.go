package main

import (
	"fmt"
	"math"
	"runtime/metrics"
	"time"
)

// schedLatencyMetric is the runtime's histogram of how long goroutines
// waited runnable before they ran (sampled by the runtime). An account
// paced at 15/s with a burst of one loses a send whenever its scheduler
// waits longer than a token's 67 ms, so bench prints it for the task.
const schedLatencyMetric = "/sched/latencies:seconds"

// schedLatencies is a snapshot of schedLatencyMetric.
type schedLatencies struct {
	counts  []uint64
	buckets []float64 // len(counts)+1 boundaries, in seconds
}

func readSchedLatencies() schedLatencies {
	s := []metrics.Sample{{Name: schedLatencyMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return schedLatencies{}
	}
	h := s[0].Value.Float64Histogram()
	return schedLatencies{counts: append([]uint64(nil), h.Counts...), buckets: h.Buckets}
}

// schedSummary is what the waits between two snapshots came to.
type schedSummary struct {
	samples    uint64
	p99, p999  time.Duration // upper bounds of the buckets the quantiles fall in
	over50ms   uint64        // samples that waited 50 ms or more
	overShare  float64       // over50ms of samples
	measurable bool
}

// since sums the waits recorded after before.
func (after schedLatencies) since(before schedLatencies) schedSummary {
	if len(after.counts) == 0 || len(before.counts) != len(after.counts) {
		return schedSummary{}
	}
	diff := make([]uint64, len(after.counts))
	var out schedSummary
	for i := range diff {
		diff[i] = after.counts[i] - before.counts[i]
		out.samples += diff[i]
		if after.buckets[i] >= 0.05 {
			out.over50ms += diff[i]
		}
	}
	if out.samples == 0 {
		return out
	}
	out.measurable = true
	out.overShare = float64(out.over50ms) / float64(out.samples)
	quantile := func(q float64) time.Duration {
		want := uint64(math.Ceil(q * float64(out.samples)))
		var cum uint64
		for i, c := range diff {
			if cum += c; cum >= want {
				upper := after.buckets[i+1]
				if math.IsInf(upper, 1) {
					upper = after.buckets[i]
				}
				return time.Duration(upper * float64(time.Second))
			}
		}
		return 0
	}
	out.p99, out.p999 = quantile(0.99), quantile(0.999)
	return out
}

func (s schedSummary) String() string {
	if !s.measurable {
		return "no samples"
	}
	return fmt.Sprintf("p99 %s, p99.9 %s, %d of %d samples (%.2f%%) 50 ms or more",
		s.p99.Round(10*time.Microsecond), s.p999.Round(10*time.Microsecond), s.over50ms, s.samples, 100*s.overShare)
}
