package main

import (
	"fmt"
	"io"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// watchLines prints what the dashboard's task chart draws, as text: one
// line per interval with what changed in it (sent, failed, skipped per
// second), what is retrying now, the task's smoothed rate and its state
// (`broadcast watch -lines`).
type watchLines struct {
	out   io.Writer
	every time.Duration
	last  *contract.Progress
	at    time.Time
	now   func() time.Time
}

func newWatchLines(out io.Writer, every time.Duration) *watchLines {
	return &watchLines{out: out, every: every, now: time.Now}
}

// update takes a progress value; it prints a line when an interval has
// passed since the last one, or the task became final.
func (w *watchLines) update(p *contract.Progress) {
	now := w.now()
	if w.last == nil {
		w.last, w.at = p, now
		fmt.Fprintf(w.out, "%s %s %s: %d recipients\n", now.Format(time.TimeOnly), p.TaskID, p.State, p.Total)
		return
	}
	dt := now.Sub(w.at)
	if dt < w.every && !p.State.Final() {
		return
	}
	secs := max(dt.Seconds(), 0.001)
	per := func(cur, prev int) string { return fmt.Sprintf("%+d (%.1f/s)", cur-prev, float64(cur-prev)/secs) }
	fmt.Fprintf(w.out, "%s %s %s: sent %s failed %s skipped %s retrying %d rate %.1f/s done %d/%d\n",
		now.Format(time.TimeOnly), p.TaskID, p.State, per(p.Sent, w.last.Sent), per(p.Failed, w.last.Failed),
		per(p.Skipped, w.last.Skipped), p.Retrying, p.RatePerSec, p.Done(), p.Total)
	w.last, w.at = p, now
}
