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

type holdShard struct {
	mu sync.Mutex
	m  map[string]*jobHold
}

// jobHold is one delivery's hold on its job.
type jobHold struct {
	released chan struct{} // made by the first delivery to wait, closed on release
}

func newJobHolds() *jobHolds {
	h := &jobHolds{seed: maphash.MakeSeed()}
	for i := range h.shards {
		h.shards[i].m = map[string]*jobHold{}
	}
	return h
}

// shard is job id's shard.
func (h *jobHolds) shard(id string) *holdShard {
	return &h.shards[maphash.String(h.seed, id)%holdShards]
}

// hold takes job id, waiting at most maxWait (or until ctx ends) while
// another delivery holds it. It returns the hold to release (nil past
// maxWait or ctx: nothing to release) and whether it waited for another
// delivery.
func (h *jobHolds) hold(ctx context.Context, id string, maxWait time.Duration) (held *jobHold, waited bool) {
	sh := h.shard(id)
	var timeout <-chan time.Time
	for {
		sh.mu.Lock()
		other := sh.m[id]
		if other == nil {
			held = &jobHold{}
			sh.m[id] = held
			sh.mu.Unlock()
			return held, waited
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
		waited = true
		select {
		case <-released:
		case <-ctx.Done():
			return nil, waited
		case <-timeout:
			return nil, waited
		}
	}
}

// release ends held, job id's hold (nil: nothing held); calling it again
// does nothing.
func (h *jobHolds) release(id string, held *jobHold) {
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
}
