package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSchedSummaryCountsOnlyTheSpan: the summary is of the waits recorded
// between the snapshots, its quantiles are bucket upper bounds, and the
// waits of 50 ms or more are counted with their share.
func TestSchedSummaryCountsOnlyTheSpan(t *testing.T) {
	buckets := []float64{0, 0.001, 0.01, 0.05, 0.1, math.Inf(1)}
	before := schedLatencies{counts: []uint64{100, 0, 0, 0, 5}, buckets: buckets}
	after := schedLatencies{counts: []uint64{1090, 0, 9, 1, 5}, buckets: buckets}

	s := after.since(before)
	require.True(t, s.measurable)
	require.Equal(t, uint64(1000), s.samples)
	require.Equal(t, uint64(1), s.over50ms, "the 5 slow waits before the span are not the task's")
	require.InDelta(t, 0.001, s.overShare, 1e-12)
	require.Equal(t, time.Millisecond, s.p99, "the 990th of 1000 waited under 1 ms")
	require.Equal(t, 50*time.Millisecond, s.p999, "the 999th under 50 ms")

	require.False(t, before.since(before).measurable)
	require.False(t, after.since(schedLatencies{}).measurable, "snapshots of different shapes are not compared")
	require.Equal(t, "no samples", before.since(before).String())
}
