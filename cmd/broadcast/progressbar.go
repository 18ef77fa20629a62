package main

import (
	"fmt"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/broadcastd/broadcast/contract"
)

// progressBar draws a task's progress on stderr: done/total, state, counts,
// the task's smoothed rate and ETA (as status computes them).
type progressBar struct {
	id  string
	bar *progressbar.ProgressBar
}

func newProgressBar(id string) *progressBar {
	return &progressBar{id: id}
}

func (b *progressBar) update(p *contract.Progress) {
	if b.bar == nil || b.bar.GetMax() != max(p.Total, 1) {
		b.bar = progressbar.NewOptions(max(p.Total, 1),
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	b.bar.Describe(fmt.Sprintf("%s %-17s sent %d retrying %d failed %d skipped %d%s  %.1f/s eta %s",
		b.id, p.State, p.Sent, p.Retrying, p.Failed, p.Skipped, receiptCounts(p), p.RatePerSec, eta(p)))
	_ = b.bar.Set(p.Done())
}

// receiptCounts describes what providers reported about the sent
// recipients, once they reported anything.
func receiptCounts(p *contract.Progress) string {
	if p.Delivered+p.Read+p.Undelivered == 0 {
		return ""
	}
	return fmt.Sprintf(" | delivered %d read %d undelivered %d", p.Delivered, p.Read, p.Undelivered)
}

func (b *progressBar) finish() {
	if b.bar != nil {
		_ = b.bar.Finish()
	}
	fmt.Fprintln(os.Stderr)
}

func eta(p *contract.Progress) string {
	if p.State.Final() || p.ETASeconds <= 0 {
		return "-"
	}
	return (time.Duration(p.ETASeconds) * time.Second).String()
}
