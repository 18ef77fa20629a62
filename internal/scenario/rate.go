package scenario

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// request is one request (call) at a provider: when it arrived, and when
// dispatch began it (zero when not known).
type request struct {
	at, started time.Time
}

// sortRequests sorts reqs by arrival.
func sortRequests(reqs []request) {
	slices.SortStableFunc(reqs, func(a, b request) int { return a.at.Compare(b.at) })
}

// rateWindow is a one-second window of requests: n from at, early of them
// held up on their way (see overRate).
type rateWindow struct {
	at    time.Time
	n     int
	early int
}

// overRate finds the window of reqs (sorted by arrival) furthest over
// limit. Requests arrive later than they began by the transport's delay
// (the sending process, the network, the receiving one); a window's
// requests that took their fastest delay began within one second, and the
// sender's pacing bounds those. A request that began before the window
// opened less that fastest delay was held up on its way: the sender paced
// it in an earlier second, so it is left out (early). A request whose
// start is not known counts in full. over is false when none is over.
func overRate(reqs []request, limit int) (worst rateWindow, over bool) {
	excess, hi := 0, 0
	for lo := range reqs {
		for hi < len(reqs) && reqs[hi].at.Sub(reqs[lo].at) < time.Second {
			hi++
		}
		w := rateWindow{at: reqs[lo].at, n: hi - lo}
		fastest, known := time.Duration(0), false
		for _, r := range reqs[lo:hi] {
			if d := r.at.Sub(r.started); !r.started.IsZero() && (!known || d < fastest) {
				fastest, known = d, true
			}
		}
		for _, r := range reqs[lo:hi] {
			if !r.started.IsZero() && r.started.Before(w.at.Add(-fastest)) {
				w.early++
			}
		}
		if e := w.n - w.early - limit; e > excess {
			excess, worst, over = e, w, true
		}
	}
	return worst, over
}

// callStarts returns when dispatch began each of the account's calls at
// its fake (by Hit.Call), from the call_started_at of the outcomes it
// told: the hits and the outcomes of one task's recipient are paired in
// order. A recipient whose hits and outcomes do not pair (a process killed
// during a call, a digest's carried items) gives none, nor one that would
// have begun after it arrived.
func (c *checker) callStarts(account string) map[int]time.Time {
	type key struct{ task, to string }
	starts := map[key][]time.Time{}
	for _, evs := range c.o.Events {
		for _, e := range evs {
			if e.Account == account && e.JobID != "" && !e.CallStartedAt.IsZero() {
				k := key{e.TaskID, e.To}
				if !slices.ContainsFunc(starts[k], e.CallStartedAt.Equal) { // an outcome told twice
					starts[k] = append(starts[k], e.CallStartedAt)
				}
			}
		}
	}
	hits := map[key][]Hit{}
	for _, h := range c.o.Hits[account] {
		k := key{h.Task, h.To}
		hits[k] = append(hits[k], h)
	}
	out := map[int]time.Time{}
	for k, hs := range hits {
		ss := starts[k]
		if len(ss) != len(hs) {
			continue
		}
		slices.SortFunc(ss, time.Time.Compare)
		if !beganBefore(ss, hs) {
			continue
		}
		for i, h := range hs {
			if s, ok := out[h.Call]; !ok || ss[i].Before(s) {
				out[h.Call] = ss[i]
			}
		}
	}
	return out
}

// beganBefore reports whether each start began no later than the hit it
// pairs with.
func beganBefore(starts []time.Time, hs []Hit) bool {
	for i, h := range hs {
		if starts[i].After(h.At) {
			return false
		}
	}
	return true
}

// edges describes how the requests of the second from at came: how many
// in its first and last 50 ms, and the first ten gaps between them. A
// bunch at the start is requests held up on the way; an even spread is
// the sender going too fast.
func edges(reqs []request, at time.Time) string {
	const edge = 50 * time.Millisecond
	first, last := 0, 0
	var gaps []string
	var prev time.Time
	for _, r := range reqs {
		t := r.at
		d := t.Sub(at)
		if d < 0 || d >= time.Second {
			continue
		}
		if d < edge {
			first++
		}
		if d >= time.Second-edge {
			last++
		}
		if !prev.IsZero() && len(gaps) < 10 {
			gaps = append(gaps, fmt.Sprintf("%.1f", t.Sub(prev).Seconds()*1000))
		}
		prev = t
	}
	return fmt.Sprintf("%d in its first 50 ms, %d in its last; first gaps (ms) %s", first, last, strings.Join(gaps, " "))
}
