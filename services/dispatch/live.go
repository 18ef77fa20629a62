package dispatch

import (
	"sync"
	"time"

	"github.com/broadcastd/broadcast/shared"
)

// A job's message can be delivered again while its earlier delivery is
// still being handled here: the lanes' ack wait is 2 s and the consume
// loop reports progress every second, but on a loaded machine a report can
// come late (seed 5 of the scenario tester, in process: ten WxPusher
// recipients accepted twice, in two calls 49 ms apart). Such a redelivery
// finds no outcome yet (the earlier delivery is waiting in the batcher, in
// the provider call, or for its sent event to be stored), so sentBefore
// would let it send too. liveJobs keeps the JOBS messages whose delivery
// is in a handler, until the loop settles it (after a sent event's store,
// shared.Then), and a redelivery of one of them is left unsettled
// (shared.Leave): the delivery in hand settles the message for both, as
// the server takes the ack, NAK or progress report of any delivery of a
// message by its stream sequence.
//
// A delivery left that way did nothing, so it spends no attempt: the next
// delivery of the message counts its attempt without it and asks the
// ledger for the outcome of the delivery that ran before it, not of the
// one left (otherwise it would take the left one for a send whose answer
// was lost and say maybe_sent).

// liveJobsKeep is how long the record of a message whose handled delivery
// was NAKed, after deliveries left to it, is kept for its next delivery.
// Retries of LongWait or more are new messages (delay.go), so a NAKed
// message comes back well within it, unless another process takes it.
const liveJobsKeep = time.Hour

// liveJobs is the JOBS messages this process handles, by stream sequence.
type liveJobs struct {
	mu    sync.Mutex
	m     map[uint64]*liveJob
	swept time.Time
}

// liveJob is one message's record.
type liveJob struct {
	// handling says a delivery of it is in a handler or waiting for its
	// settlement.
	handling bool
	// last is the delivery count of the delivery that ran the steps last.
	last uint64
	// left counts the deliveries left to another one, and leftThrough is
	// the highest delivery count among them.
	left, leftThrough uint64
	// at is when the last handled delivery was settled.
	at time.Time
}

// liveClaim is a delivery's hold on its message, from claim to settle.
type liveClaim struct {
	x   *liveJobs
	seq uint64
	n   uint64
	// prev is the delivery count of the delivery that ran before this
	// one (0: none), and left the deliveries left to others before it.
	prev, left uint64
}

func newLiveJobs() *liveJobs { return &liveJobs{m: map[uint64]*liveJob{}} }

// claim takes delivery n of the message at seq. It returns nil when an
// earlier delivery of the message is being handled in this process: the
// caller leaves this one unsettled.
func (x *liveJobs) claim(seq, n uint64) *liveClaim {
	x.mu.Lock()
	defer x.mu.Unlock()
	j := x.m[seq]
	switch {
	case j != nil && j.handling:
		if n > j.last {
			j.left++
			j.leftThrough = max(j.leftThrough, n)
		}
		return nil
	case j == nil || n <= j.last:
		// First seen here, or the delivery counts started again (a
		// consumer created anew): nothing known.
		x.m[seq] = &liveJob{handling: true, last: n}
		return &liveClaim{x: x, seq: seq, n: n, prev: n - 1}
	}
	c := &liveClaim{x: x, seq: seq, n: n, prev: j.last, left: j.left}
	j.handling, j.last = true, n
	return c
}

// deliveredThrough is the highest delivery count of the claimed message
// seen here: the claim's own, or that of a delivery left to it since.
// A delivery that hands its job back unsent names it in the ledger, so
// that the next delivery, in whatever process, finds the one before it
// settled (a left delivery did nothing, and another process cannot know
// of it).
func (c *liveClaim) deliveredThrough() uint64 {
	if c == nil {
		return 0
	}
	c.x.mu.Lock()
	defer c.x.mu.Unlock()
	n := c.n
	if j := c.x.m[c.seq]; j != nil && j.last == c.n {
		n = max(n, j.leftThrough)
	}
	return n
}

// settled ends the claim with the outcome the loop settles the message by.
// The record stays only when the message comes back (NAKed) and deliveries
// were left before it, which the next delivery must not count.
func (c *liveClaim) settled(out error) {
	x := c.x
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now()
	if now.Sub(x.swept) > liveJobsKeep/4 {
		x.swept = now
		for seq, j := range x.m {
			if !j.handling && now.Sub(j.at) > liveJobsKeep {
				delete(x.m, seq)
			}
		}
	}
	j := x.m[c.seq]
	if j == nil || !j.handling || j.last != c.n {
		return
	}
	if out == nil || shared.IsPermanent(out) || j.left == 0 {
		// Acknowledged or terminated: gone. Or nothing to remember.
		delete(x.m, c.seq)
		return
	}
	j.handling, j.at = false, now
}
