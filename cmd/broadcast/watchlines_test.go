package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// TestWatchLines: a line per interval with the changes per second, none
// in between, and one for the final state at once.
func TestWatchLines(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.Local)
	w := newWatchLines(&out, time.Second)
	w.now = func() time.Time { return now }
	p := func(state contract.TaskState, sent, failed, retrying int) *contract.Progress {
		return &contract.Progress{TaskID: "t1", State: state, Total: 100, Sent: sent, Failed: failed, Retrying: retrying, RatePerSec: 19.5}
	}
	w.update(p(contract.StateProcessing, 0, 0, 0))
	now = now.Add(500 * time.Millisecond)
	w.update(p(contract.StateProcessing, 10, 0, 1)) // within the interval: no line
	now = now.Add(1500 * time.Millisecond)
	w.update(p(contract.StateProcessing, 40, 2, 3))
	now = now.Add(100 * time.Millisecond)
	w.update(p(contract.StatePartial, 98, 2, 0)) // final: at once
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Equal(t, []string{
		"10:00:00 t1 processing: 100 recipients",
		"10:00:02 t1 processing: sent +40 (20.0/s) failed +2 (1.0/s) skipped +0 (0.0/s) retrying 3 rate 19.5/s done 42/100",
		"10:00:02 t1 partial: sent +58 (580.0/s) failed +0 (0.0/s) skipped +0 (0.0/s) retrying 0 rate 19.5/s done 100/100",
	}, lines)
}
