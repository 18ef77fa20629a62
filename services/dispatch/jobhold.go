package dispatch

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// Two messages of one job can be live at once: a job published again
// after JOBS's duplicate window forgot the first (a batch rendered again
// by a resumed expansion, a retry-dead repeated after a crash), or a
// crashed original beside its copy. The later one is checked for an
// earlier send (sentBefore), but checked while the other is being sent it
// finds none and sends too (16 sends for 8 jobs queued twice,
// TestTwoMessagesOfOneJobSendOnce). So every delivery holds its job here,
// by id, until it is settled (its sent event stored), and a delivery of
// another message of the job waits for it and is then checked, whatever
// it is (a first delivery from render would skip the check), so it finds
// the send. The messages of one job go to one account, which one process
// consumes, so a hold within the process is enough.
//
// A message published again can also overtake its first: a job group's
// later parts begin one after another, so a repeat of one of them may be
// sent and settled before the part begins, and the part, a first delivery,
// would not be checked (multi-process scenario seed 596367550). So a
// delivery of a job published as one that may have been sent already
// (Job.Recheck: a repeat, a copy, a re-queue) leaves a mark when it is
// settled, and a delivery of the job that finds one (within markKeep) is
// checked too.
//
// The wait is bounded (holdWait): the holder may wait long for its turn,
// and two job groups holding each other's jobs would wait for each other
// (each is settled once all its parts are). Past it the delivery goes on
// unheld and is checked as before.

// holdWait bounds how long a delivery waits for another message of its
// job.
const holdWait = 30 * time.Second

// jobHolds is the jobs held by the deliveries handled here, by job id,
// in shards so that thousands of handlers do not share one lock.
type jobHolds struct {
	seed   maphash.Seed
	shards [holdShards]holdShard
}

const holdShards = 64

// markKeep is how long a mark is kept (the expired ones are swept every
// markKeep/4); maxMarks bounds a shard's marks (about 6 MB over all
// shards at most): past it, any one is dropped.
const (
	markKeep = 10 * time.Minute
	maxMarks = 1024
)

type holdShard struct {
	mu    sync.Mutex
	m     map[string]*jobHold
	marks map[string]time.Time // job id -> when a Job.Recheck delivery of it was settled
	swept time.Time
}

// jobHold is one delivery's hold on its job.
type jobHold struct {
	released chan struct{} // made by the first delivery to wait, closed on release
}

func newJobHolds() *jobHolds {
	h := &jobHolds{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].m, h.shards[i].marks = map[string]*jobHold{}, map[string]time.Time{}
	}
	return h
}

// shard is job id's shard.
func (h *jobHolds) shard(id string) *holdShard {
	return &h.shards[maphash.String(h.seed, id)%holdShards]
}

// hold takes job id, waiting at most maxWait (or until ctx ends) while
// another delivery holds it. It returns the hold to release (nil past
// maxWait or ctx: nothing to release) and whether another message of the
// job was handled here first: it waited for one, or found its mark.
func (h *jobHolds) hold(ctx context.Context, id string, maxWait time.Duration) (held *jobHold, another bool) {
	sh := h.shard(id)
	var timeout <-chan time.Time
	for {
		sh.mu.Lock()
		other := sh.m[id]
		if other == nil {
			if at, ok := sh.marks[id]; ok {
				if time.Since(at) < markKeep {
					another = true
				} else {
					delete(sh.marks, id)
				}
			}
			held = &jobHold{}
			sh.m[id] = held
			sh.mu.Unlock()
			return held, another
		}
		if other.released == nil {
			other.released = make(chan struct{})
		}
		released := other.released
		sh.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(maxWait)
			defer t.Stop()
			timeout = t.C
		}
		another = true
		select {
		case <-released:
		case <-ctx.Done():
			return nil, another
		case <-timeout:
			return nil, another
		}
	}
}

// release ends held, job id's hold (nil: nothing held), leaving a mark
// when mark is set (the delivery's job carried Job.Recheck); calling it
// again does nothing.
func (h *jobHolds) release(id string, held *jobHold, mark bool) {
	if held == nil {
		return
	}
	sh := h.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m[id] != held {
		return
	}
	delete(sh.m, id)
	if held.released != nil {
		close(held.released)
	}
	if mark {
		now := time.Now()
		if now.Sub(sh.swept) > markKeep/4 {
			sh.swept = now
			for old, at := range sh.marks {
				if now.Sub(at) >= markKeep {
					delete(sh.marks, old)
				}
			}
		}
		if len(sh.marks) >= maxMarks {
			for old := range sh.marks {
				delete(sh.marks, old)
				break
			}
		}
		sh.marks[id] = now
	}
}
