package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// sentIndex answers "was this job sent already?" from the task's sent
// events. Dispatch publishes a job's sent event, and waits for the stream to
// store it, before it acknowledges the job: so for any job that comes back
// after a successful send (a crash or a lost ack), its sent event is in
// EVENTS. That makes the events the idempotency ledger for successes, at no
// cost per send: an extra ledger write and read per recipient halved the
// pipeline's throughput. Only jobs that may have been sent before are
// checked (see Job.Recheck); the check loads the task's sent events once per
// process, as a bitmap of recipient indexes, and then only the new ones.
type sentIndex struct {
	js jetstream.JetStream

	mu    sync.Mutex
	tasks map[string]*taskSent
}

// sentIndexIdle is how long a task's bitmap is kept after its last use.
const sentIndexIdle = 10 * time.Minute

// taskSent is one task's sent recipients as far as EVENTS has been read.
type taskSent struct {
	mu   sync.Mutex
	next uint64 // the stream sequence to read from next
	cons jetstream.Consumer
	bits []uint64
	// others holds test recipients and indexes beyond the bitmap.
	others map[sentKey]bool
	used   time.Time
}

func newSentIndex(js jetstream.JetStream) *sentIndex {
	return &sentIndex{js: js, tasks: map[string]*taskSent{}}
}

// sent reports whether the job's recipient has a sent event.
func (x *sentIndex) sent(ctx context.Context, job *shared.Job) (bool, error) {
	t := x.task(job.TaskID)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.has(job.Index, job.Test) {
		return true, nil
	}
	if err := t.catchUp(ctx, x.js, job.TaskID); err != nil {
		return false, fmt.Errorf("read sent events of %s: %w", job.TaskID, err)
	}
	return t.has(job.Index, job.Test), nil
}

// task returns the task's entry, dropping entries idle for long.
func (x *sentIndex) task(taskID string) *taskSent {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now()
	for id, t := range x.tasks {
		if now.Sub(t.used) > sentIndexIdle && t.mu.TryLock() {
			delete(x.tasks, id)
			t.mu.Unlock()
		}
	}
	t := x.tasks[taskID]
	if t == nil {
		t = &taskSent{others: map[sentKey]bool{}}
		x.tasks[taskID] = t
	}
	t.used = now
	return t
}

// maxBitmapIndex bounds the bitmap (16 MiB at most); indexes beyond it, as
// in a stray event, are kept in the map instead.
const maxBitmapIndex = 1 << 27

func (t *taskSent) has(index int, test bool) bool {
	if index < 0 {
		return false
	}
	if test || index >= maxBitmapIndex {
		return t.others[key(index, test)]
	}
	w := index / 64
	return w < len(t.bits) && t.bits[w]&(1<<(index%64)) != 0
}

func (t *taskSent) mark(index int, test bool) {
	if index < 0 {
		return
	}
	if test || index >= maxBitmapIndex {
		t.others[key(index, test)] = true
		return
	}
	w := index / 64
	if w >= len(t.bits) {
		t.bits = slices.Grow(t.bits, w+1-len(t.bits))[:w+1]
	}
	t.bits[w] |= 1 << (index % 64)
}

type sentKey struct {
	index int
	test  bool
}

func key(index int, test bool) sentKey { return sentKey{index, test} }

// catchUp reads the task's sent events stored since the last read, up to
// the last one stored now. The task's ordered consumer lives as long as its
// entry, so each event is read once per process however many jobs are
// checked.
func (t *taskSent) catchUp(ctx context.Context, js jetstream.JetStream, taskID string) error {
	subject := shared.SubjectEventsPrefix + taskID + "." + string(shared.EventSent)
	stream, err := js.Stream(ctx, shared.StreamEvents)
	if err != nil {
		return err
	}
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if last.Sequence < t.next {
		return nil
	}
	if t.cons == nil {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}
		if t.next > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, t.next
		}
		if t.cons, err = js.OrderedConsumer(ctx, shared.StreamEvents, cfg); err != nil {
			return err
		}
	}
	for empty := 0; t.next <= last.Sequence; {
		batch, err := t.cons.FetchNoWait(1000)
		if err != nil {
			t.cons = nil
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			var ev struct {
				JobID string `json:"job_id"`
				Index int    `json:"index"`
			}
			if json.Unmarshal(m.Data(), &ev) == nil {
				if _, _, test, err := shared.ParseJobID(ev.JobID); err == nil {
					t.mark(ev.Index, test)
				}
			}
			t.next = meta.Sequence.Stream + 1
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.cons = nil
			return err
		}
		if got == 0 {
			// The stored event is not delivered yet: give the consumer a
			// moment, then give up (the job is retried, never sent blind).
			if empty++; empty == 50 {
				t.cons = nil
				return fmt.Errorf("sent events end at %d, before the last one (%d)", t.next, last.Sequence)
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}
