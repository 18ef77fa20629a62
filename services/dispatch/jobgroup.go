package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// A job message may carry a job group: several jobs of the account, one a
// line (contract.SplitJobs), which render publishes to save the stream a
// message per job. Each job goes through handle's steps as if it had come
// alone, as a part of the message (partMsg): the same delivery (stream
// sequence and delivery count) names it in the ledger, its ledger entry
// and id are its own. The message is acknowledged once every part is done.
// A part that must come back later (a failed send's retry) comes back as a
// copy of its own, scheduled and recorded in the ledger first (delayJob,
// whatever its delay), so the message can still be acknowledged and its
// other parts are not handled again. Only a part that could not finish
// (stopping, a lost lease, a store that failed) has the whole message
// NAKed: on its redelivery the parts done before are found done
// (sentBefore: sent events, give-ups and hand-offs in the ledger) and
// nothing is sent twice.

// groupJobsWaiting is how many jobs of job groups a lane of a holds in
// its handlers before their turns: its messages' worth at render's
// default group size (contract.DefaultJobGroupSize), so a group's jobs
// wait for their turns together and share the turns' ticks and the
// events' writes as jobs alone do across messages, but no more than the
// account's burst, one more, and what its rate starts within
// pacedHorizon, and at most maxJobsInFlight. A job granted its turn
// leaves their count (the scheduler's in-flight slots bound the jobs past
// it), so a slow provider still gets the account's concurrency of calls.
// Each job held is a goroutine waiting on the scheduler, so a process
// with many slow accounts holds two or three of each instead of every job
// delivered. A batch account's lanes hold what their calls fill
// (jobsInFlight), its jobs counted until they are done.
func groupJobsWaiting(a *contract.Account, p contract.Priority) int {
	n := jobsInFlight(a, p)
	held := float64(min(n*contract.DefaultJobGroupSize, maxJobsInFlight))
	if a.MaxBatch > 1 {
		return max(n, int(held))
	}
	return max(1, int(min(held, float64(a.Burst)+max(1, a.RatePerSec*pacedHorizon.Seconds()))))
}

// partIdle is how long a goroutine that ran a job group's part waits for
// the next before it ends (shared.GoPool): a part grows its stack to tens
// of KB, which a goroutine per part grew and copied anew each time.
const partIdle = 10 * time.Second

// pacedHorizon is how far ahead of its pacing a lane of job groups holds
// jobs waiting for their turns: enough that the pacer never waits for a
// job to begin. Each job held is a goroutine the scheduler and the
// collector visit: with 1,000 accounts at 15/s, half a second (8 jobs an
// account) ran 0-13 % slower than a tenth (2) in three series, and a
// twentieth (1, none waiting behind the one granted) left the pacer
// waiting, at four fifths of the rate.
const pacedHorizon = 100 * time.Millisecond

// partMsg is one job of a job group's delivered message. queued tells the
// next part it may begin: this one waits for its turn or is done.
type partMsg struct {
	jetstream.Msg
	data   []byte
	queued func()
	// granted frees the part's place among the lane's waiting jobs, when
	// its turn comes or it is done, whichever is first (a batch account's
	// jobs take no turn: theirs is freed when they are done).
	granted func()
}

func (p *partMsg) Data() []byte { return p.data }

// handleGroup runs the parts of a job group's delivery (meta, claimed)
// at once, each through handleClaimed, and returns the message's outcome
// once theirs are known (shared.Later): nil when every part is done (a
// part given up is dead-lettered as it is, settlePart), else a retry after
// the shortest delay a part asked for.
func (r *accountRunner) handleGroup(ctx context.Context, sched *scheduler, lane int, recheckThrough uint64, jobs chan struct{}, msg jetstream.Msg, meta *jetstream.MsgMetadata, claim *liveClaim, parts [][]byte) error {
	// The digest backlog rule counts the jobs queued behind (noteQueue);
	// the messages behind are groups as well.
	gm := *meta
	gm.NumPending *= uint64(len(parts))
	outs := make([]error, len(parts))
	// The parts run at once, but each begins once the one before waits
	// for its turn or has joined the batcher (or is done), so they queue
	// in the group's order and the account sends its recipients in the
	// list's order, as it does jobs alone. Each takes one of the lane's
	// places for waiting jobs (jobs, groupJobsWaiting) until its turn
	// comes, which bounds the jobs a lane of job groups holds in its
	// handlers.
	var wg sync.WaitGroup
	for i, data := range parts {
		if sched.ended() {
			// The session ended (a stop, a hand-over, a lost lease): the
			// parts not begun go back with the message without a step.
			outs[i] = r.leaveUnbegun(msg, meta, recheckThrough, claim, data, errSchedStopped)
			continue
		}
		select {
		case jobs <- struct{}{}:
		case <-ctx.Done():
			outs[i] = r.leaveUnbegun(msg, meta, recheckThrough, claim, data, ctx.Err())
			continue
		}
		next := make(chan struct{})
		pm := &partMsg{Msg: msg, data: data, queued: sync.OnceFunc(func() { close(next) }), granted: sync.OnceFunc(func() { <-jobs })}
		wg.Add(1)
		r.svc.parts.Go(func() {
			defer wg.Done()
			defer pm.granted()
			outs[i] = r.settlePart(ctx, pm, r.handlePart(ctx, sched, lane, recheckThrough, pm, &gm, claim))
		})
		<-next
	}
	wg.Wait()
	return shared.Later(func(ctx context.Context) error {
		var retry error
		var delay time.Duration
		for _, out := range outs {
			if out = shared.Wait(ctx, out); out == nil {
				continue
			}
			d, ok := shared.RetryDelay(out)
			if !ok {
				d = r.svc.cfg.BackoffBase
			}
			if retry == nil || d < delay {
				retry, delay = out, d
			}
		}
		if retry != nil {
			return shared.RetryAfter(delay, fmt.Errorf("a job of the message's group: %w", retry))
		}
		return nil
	})
}

// settlePart dead-letters a part given up at once, as the consume loop
// does a job alone, so its failed event comes when it was decided, not
// when the last part of its group is done (the circuit breaker reads the
// order of outcomes). A dead letter that fails is a retry of the message.
func (r *accountRunner) settlePart(ctx context.Context, msg *partMsg, out error) error {
	if !shared.IsPermanent(out) {
		return out
	}
	if err := r.svc.deadLetter(ctx, msg, out); err != nil {
		return fmt.Errorf("dead letter: %w (giving up: %v)", err, out)
	}
	return nil
}

// handlePart is handleClaimed for one part, with a panic turned into a
// retry of the message, as the consume loop does for a whole one.
func (r *accountRunner) handlePart(ctx context.Context, sched *scheduler, lane int, recheckThrough uint64, msg *partMsg, meta *jetstream.MsgMetadata, claim *liveClaim) (out error) {
	defer msg.queued()
	defer func() {
		if p := recover(); p != nil {
			out = shared.RetryAfter(30*time.Second, errors.New("handler panic: "+fmt.Sprint(p)))
		}
	}()
	return r.handleClaimed(ctx, sched, lane, recheckThrough, msg, meta, claim)
}

// leftAtStop records as left unsent each job of a message delivered to the
// lane's consume loop after its stop began, which no handler saw (the
// loop hands it back: shared.ConsumeConfig.LeftAtStop). Unrecorded, the
// delivery would leave a gap in the delivery counts the ledger holds and
// its next delivery would say maybe_sent.
func (r *accountRunner) leftAtStop(recheckThrough uint64) func(context.Context, jetstream.Msg) {
	return func(_ context.Context, msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			return
		}
		claim := r.svc.live.claim(meta.Sequence.Stream, meta.NumDelivered)
		if claim == nil {
			return // left to the delivery in hand, which counts it
		}
		why := errors.New("left unbegun at a stop")
		out := shared.RetryAfter(0, why)
		for _, data := range contract.SplitJobs(msg.Data()) {
			_ = r.leaveUnbegun(msg, meta, recheckThrough, claim, data, why)
		}
		claim.settled(out)
	}
}

// leaveUnbegun hands back a part that the session's end left unbegun,
// recorded in its ledger entry as left unsent (noteLeftUnsent) so that
// its redelivery does not take it for a send whose answer was lost.
func (r *accountRunner) leaveUnbegun(msg jetstream.Msg, meta *jetstream.MsgMetadata, recheckThrough uint64, claim *liveClaim, data []byte, why error) error {
	out := shared.RetryAfter(0, why)
	d, err := r.receive(&partMsg{Msg: msg, data: data, queued: func() {}}, meta, recheckThrough, claim)
	if err != nil {
		return out // its redelivery gives it up
	}
	if d.checked() {
		// Handled before, maybe: the entry holds what that left.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 2*time.Second)
		le, err := r.svc.readLedger(ctx, &d.job)
		cancel()
		if err != nil {
			return out
		}
		d.entry = le
		d.job.MaybeSent = d.job.MaybeSent || d.mayFollowLostAnswer()
	}
	r.noteLeftUnsent(d)
	return out
}
