package process

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// progressWatch records every progress value written to KV
// broadcast_progress, per task, in order, with when it arrived.
type progressWatch struct {
	mu     sync.Mutex
	values map[string][]seenProgress
}

// seenProgress is one progress value and when the watch saw it.
type seenProgress struct {
	at time.Time
	p  contract.Progress
}

// watchProgress starts recording until the test ends.
func watchProgress(t *testing.T, c *chaosClient) *progressWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kv, err := c.js.KeyValue(ctx, contract.BucketProgress)
	require.NoError(t, err)
	w, err := kv.WatchAll(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop() })
	pw := &progressWatch{values: map[string][]seenProgress{}}
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var p contract.Progress
			if json.Unmarshal(e.Value(), &p) == nil {
				pw.mu.Lock()
				pw.values[e.Key()] = append(pw.values[e.Key()], seenProgress{time.Now(), p})
				pw.mu.Unlock()
			}
		}
	}()
	return pw
}

// last is task's latest value, if any.
func (pw *progressWatch) last(task string) (seenProgress, bool) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	v := pw.values[task]
	if len(v) == 0 {
		return seenProgress{}, false
	}
	return v[len(v)-1], true
}

// movedSince reports whether task's latest value arrived after since and
// counts more sent than before.
func (pw *progressWatch) movedSince(task string, since time.Time, before int) bool {
	v, ok := pw.last(task)
	return ok && v.at.After(since) && v.p.Sent > before
}

// count is how many values of task arrived.
func (pw *progressWatch) count(task string) int {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return len(pw.values[task])
}

// requireMonotonic fails unless sent and failed never went back in any
// value of task.
func (pw *progressWatch) requireMonotonic(t *testing.T, task string) {
	t.Helper()
	pw.mu.Lock()
	defer pw.mu.Unlock()
	vs := pw.values[task]
	for i := 1; i < len(vs); i++ {
		a, b := vs[i-1].p, vs[i].p
		require.GreaterOrEqual(t, b.Sent, a.Sent, "%s: sent went back at value %d", task, i)
		require.GreaterOrEqual(t, b.Failed, a.Failed, "%s: failed went back at value %d", task, i)
	}
}

// longestGap is the longest time in [from, to] without a new value of
// task, counting from from to the first value and from the last to to.
func (pw *progressWatch) longestGap(task string, from, to time.Time) time.Duration {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	var longest time.Duration
	prev := from
	for _, v := range pw.values[task] {
		if v.at.Before(from) || v.at.After(to) {
			continue
		}
		longest = max(longest, v.at.Sub(prev))
		prev = v.at
	}
	return max(longest, to.Sub(prev))
}

// logLast logs the last values of each task, for a failure that follows.
func (pw *progressWatch) logLast(t *testing.T, since time.Time, tasks ...string) {
	t.Helper()
	pw.mu.Lock()
	defer pw.mu.Unlock()
	for _, task := range tasks {
		vs := pw.values[task]
		for _, v := range vs[max(0, len(vs)-3):] {
			t.Logf("%s at %s: %s sent %d", task, v.at.Sub(since), v.p.State, v.p.Sent)
		}
	}
}
