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

	"github.com/broadcastd/broadcast/contract"
)

// sentIndex answers "was this job sent already?" from the task's sent
// events. Dispatch publishes a job's sent event, and waits for the stream to
// store it, before it acknowledges the job: so for any job that comes back
// after a successful send (a crash or a lost ack), its sent event is in
// EVENTS. That makes the events the record of successes, at no cost per
// send: an extra ledger write and read per recipient halved the
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
	// reader is an ephemeral consumer of the task's sent events positioned
	// at next (nil until needed, or after it failed); readSeq is the
	// consumer sequence of the last event read from it.
	reader  jetstream.Consumer
	readSeq uint64
	bits    []uint64
	// readAt is when the last complete read began: every sent event
	// stored before then is marked. The lookups that queued for the lock
	// behind that read share it instead of each reading again (two API
	// requests, one after another: the 1,400 unparked jobs of a cancelled
	// task were cancelled at about 100 a second on a loaded machine).
	readAt time.Time
	// others holds test recipients and indexes beyond the bitmap.
	others map[sentKey]bool
	used   time.Time
}

func newSentIndex(js jetstream.JetStream) *sentIndex {
	return &sentIndex{js: js, tasks: map[string]*taskSent{}}
}

// sent reports whether the job's recipient has a sent event.
func (x *sentIndex) sent(ctx context.Context, job *contract.Job) (bool, error) {
	asked := time.Now()
	t := x.task(job.TaskID)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.has(job.Index, job.Test) {
		return true, nil
	}
	if t.readAt.After(asked) {
		// A read that began after this question, while it waited for the
		// lock, saw every sent event stored before it: its answer stands.
		return false, nil
	}
	began := time.Now()
	if err := t.catchUp(ctx, x.js, job.TaskID); err != nil {
		return false, fmt.Errorf("read sent events of %s: %w", job.TaskID, err)
	}
	t.readAt = began
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

// readerIdle is how long the server keeps a task's reader without fetches.
const readerIdle = time.Minute

// catchUp reads the task's sent events stored since the last read, up to
// the last one stored now, with one ephemeral consumer per task entry that
// only moves forward, so each event is read once per process however many
// jobs are checked. Not an ordered consumer: its every fetch deletes its
// consumer and creates another (two API requests, through the meta leader
// in a cluster, retried without end while a failover blocks them, which
// held every job of the task). Instead the reader checks the order itself:
// a gap in its consumer sequence (a delivery lost in transit) drops it, and
// the next read starts a new one where the last complete read ended.
func (t *taskSent) catchUp(ctx context.Context, js jetstream.JetStream, taskID string) error {
	subject := contract.SubjectEventsPrefix + taskID + "." + string(contract.EventSent)
	stream, err := js.Stream(ctx, contract.StreamEvents)
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
	fresh := false
	if t.reader == nil {
		if err := t.newReader(ctx, stream, taskID, subject); err != nil {
			return err
		}
		fresh = true
	}
	for empty := 0; t.next <= last.Sequence; {
		got, gap, err := t.fetch()
		if err != nil && !fresh {
			// The reader is gone on the server (idle too long, or lost
			// with a node): start a new one where this one stopped.
			if err := t.newReader(ctx, stream, taskID, subject); err != nil {
				return err
			}
			fresh = true
			continue
		}
		if err != nil {
			t.reader = nil
			return err
		}
		if gap {
			t.reader = nil
			return fmt.Errorf("sent events: a delivery was lost after stream sequence %d; reading again from there", t.next-1)
		}
		if got == 0 {
			// The stored event is not delivered yet: give the consumer a
			// moment, then give up (the job is retried, never sent blind).
			if empty++; empty == 50 {
				return fmt.Errorf("sent events end at %d, before the last one (%d)", t.next, last.Sequence)
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetch reads what the reader has now and marks it, in order: gap reports
// a delivery missing before the others (nothing after it is used).
func (t *taskSent) fetch() (got int, gap bool, err error) {
	batch, err := t.reader.FetchNoWait(1000)
	if err != nil {
		return 0, false, err
	}
	for m := range batch.Messages() {
		got++
		meta, err := m.Metadata()
		if gap || err != nil || meta.Sequence.Consumer != t.readSeq+1 {
			gap = true // read the batch to its end, use nothing more
			continue
		}
		t.readSeq = meta.Sequence.Consumer
		var ev struct {
			JobID string `json:"job_id"`
			Index int    `json:"index"`
		}
		if json.Unmarshal(m.Data(), &ev) == nil {
			if _, _, test, err := contract.ParseJobID(ev.JobID); err == nil {
				t.mark(ev.Index, test)
			}
		}
		t.next = meta.Sequence.Stream + 1
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return got, gap, err
	}
	return got, gap, nil
}

// newReader creates the task's reader at t.next.
func (t *taskSent) newReader(ctx context.Context, stream jetstream.Stream, taskID, subject string) error {
	cfg := jetstream.ConsumerConfig{
		Description:       "dispatch: sent events of task " + taskID + " (idempotency check)",
		FilterSubject:     subject,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: readerIdle,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if t.next > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, t.next
	}
	t.reader, t.readSeq = nil, 0
	reader, err := stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	t.reader = reader
	return nil
}
