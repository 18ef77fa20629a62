package pipelinetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// Progress reads a task's progress, or nil when there is none yet or it
// could not be read (logged): callers poll it, and a cluster electing the
// bucket's leader answers no for a moment.
func (ts *Server) Progress(t testing.TB, taskID string) *contract.Progress {
	t.Helper()
	p, err := ts.progress(taskID)
	if err != nil {
		t.Logf("progress of %s not read: %v", taskID, err)
	}
	return p
}

// progress reads a task's progress: nil and no error when there is none
// yet, an error when the bucket could not be reached.
func (ts *Server) progress(taskID string) (*contract.Progress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", contract.BucketProgress, err)
	}
	e, err := kv.Get(ctx, taskID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", taskID, err)
	}
	var p contract.Progress
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return nil, fmt.Errorf("progress of %s: %w", taskID, err)
	}
	return &p, nil
}

// WaitProgress polls a task's progress every 50 ms until cond holds for it
// and returns it; after timeout it fails the test with msgAndArgs (a
// format and its arguments), the last progress read and the last read
// error. A read that fails (a cluster electing a new leader for the
// bucket) is tried again, like a user polling `nats kv get`.
func (ts *Server) WaitProgress(t testing.TB, taskID string, timeout time.Duration, cond func(*contract.Progress) bool, msgAndArgs ...any) *contract.Progress {
	t.Helper()
	var (
		p       *contract.Progress
		lastErr error
	)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		got, err := ts.progress(taskID)
		if err != nil {
			lastErr = err
		} else if p = got; p != nil && cond(p) {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	what := "condition not met"
	if len(msgAndArgs) > 0 {
		if format, ok := msgAndArgs[0].(string); ok {
			what = fmt.Sprintf(format, msgAndArgs[1:]...)
		}
	}
	require.FailNowf(t, "task progress", "task %s: %s after %s; last progress: %+v; last read error: %v", taskID, what, timeout, p, lastErr)
	return nil
}

// WaitFinal is WaitProgress until the task's state is final.
func (ts *Server) WaitFinal(t testing.TB, taskID string, timeout time.Duration) *contract.Progress {
	t.Helper()
	return ts.WaitProgress(t, taskID, timeout, func(p *contract.Progress) bool { return p.State.Final() }, "not final")
}

// WaitFinalMoving waits until the task's state is final for as long as its
// progress moves: it fails the test when no recipient reached a final
// outcome for stall, or after limit in all. For a phase whose length is
// the machine's speed (cancelling a large backlog: every queued job still
// gets its cancelled event, at whatever rate the CPU allows), a stall is
// the failure, not a slow but steady finish.
func (ts *Server) WaitFinalMoving(t testing.TB, taskID string, stall, limit time.Duration) *contract.Progress {
	t.Helper()
	start := time.Now()
	done, moved := -1, start
	p := ts.WaitProgress(t, taskID, limit, func(p *contract.Progress) bool {
		if p.State.Final() {
			return true
		}
		if n := p.Done(); n != done {
			done, moved = n, time.Now()
		}
		require.Less(t, time.Since(moved), stall, "task %s: no recipient's outcome for %s; progress %+v", taskID, stall, p)
		return false
	}, "not final")
	t.Logf("task %s final %s after the wait began", taskID, time.Since(start).Round(time.Millisecond))
	return p
}
