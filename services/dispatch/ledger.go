package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// maxHistory bounds the attempt errors kept per job.
const maxHistory = 20

// ledgerEntry is a job's entry in the ledger, KV broadcast_ledger: the
// errors of its earlier attempts ("retrying", for the dead letter), or
// "sent" when a successful send's event could not be stored, which stops
// a redelivery from sending it again (the sent events do that otherwise,
// sentindex.go).
type ledgerEntry struct {
	State      string                  `json:"state"`
	Account    string                  `json:"account"`
	Attempt    int                     `json:"attempt"`
	ProviderID string                  `json:"provider_id,omitempty"`
	At         time.Time               `json:"at"`
	History    []contract.AttemptError `json:"history,omitempty"`
	// Seq and Delivery name the delivery whose outcome the entry holds
	// last: the JOBS message (stream sequence) and its delivery count. A
	// redelivery asks whether its previous delivery left an outcome by
	// them, not by attempt number, which repeats across a move that spent
	// no attempt and is shared by copies of one job.
	Seq      uint64 `json:"seq,omitempty"`
	Delivery uint64 `json:"delivery,omitempty"`
	// MaybeSent says an attempt it holds may have followed a send whose
	// answer was lost (Job.MaybeSent). A redelivery after that attempt finds
	// its previous delivery settled and its message without the mark, so
	// it learns it here.
	MaybeSent bool `json:"maybe_sent,omitempty"`
	// Handoffs are the latest copies deliveries published in place of
	// their messages (handoff.go): a redelivery of such a message
	// publishes its copy again instead of sending.
	Handoffs []handoff `json:"handoffs,omitempty"`
	// GivenUp says generation Generation of the job was given up on (its
	// last attempt in History): a redelivery after a crash before its
	// dead letter or its termination was stored gives up again, never
	// sends. A dead letter re-queued (a new generation) is not held by it.
	GivenUp    bool `json:"given_up,omitempty"`
	Generation int  `json:"generation,omitempty"`

	// rev is the revision the entry was read at (0: none was stored), so
	// writeLedger knows whether another message of the job wrote since.
	rev uint64
}

// readLedger returns the job's ledger entry, or an empty one.
func (s *Service) readLedger(ctx context.Context, job *contract.Job) (*ledgerEntry, error) {
	le, _, err := s.readLedgerRevision(ctx, job)
	return le, err
}

// readLedgerRevision is readLedger with the entry's revision (0: none
// stored), for updateLedger.
func (s *Service) readLedgerRevision(ctx context.Context, job *contract.Job) (*ledgerEntry, uint64, error) {
	e, err := s.ledger.Get(ctx, job.LedgerKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &ledgerEntry{}, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var le ledgerEntry
	if err := json.Unmarshal(e.Value(), &le); err != nil {
		return &ledgerEntry{rev: e.Revision()}, e.Revision(), nil
	}
	le.rev = e.Revision()
	return &le, e.Revision(), nil
}

// updateLedger stores the entry if it is still at revision rev;
// otherwise it fails with jetstream.ErrKeyRevisionMismatch.
func (s *Service) updateLedger(ctx context.Context, job *contract.Job, le *ledgerEntry, rev uint64) error {
	data, err := json.Marshal(le)
	if err != nil {
		return err
	}
	nrev, err := s.ledger.Update(ctx, job.LedgerKey(), data, rev)
	if err == nil {
		le.rev = nrev
	}
	return err
}

// writeLedger stores the entry over the one it was read from. When
// another message of the job wrote the entry since (an original and its
// copy, or two copies, live at once after a crash), what that write holds
// against a repeat is kept (keepGuards) and the write is tried again: a
// plain overwrite could erase a copy's record or its claim, and let the
// original or a second copy send.
func (s *Service) writeLedger(ctx context.Context, job *contract.Job, le *ledgerEntry) error {
	for range maxLedgerWrites {
		data, err := json.Marshal(le)
		if err != nil {
			return err
		}
		var rev uint64
		if le.rev == 0 {
			rev, err = s.ledger.Create(ctx, job.LedgerKey(), data)
		} else {
			rev, err = s.ledger.Update(ctx, job.LedgerKey(), data, le.rev)
		}
		if err == nil {
			le.rev = rev
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
		stored, _, err := s.readLedgerRevision(ctx, job)
		if err != nil {
			return err
		}
		le.keepGuards(stored)
	}
	return errLedgerContended
}

// maxLedgerWrites bounds writeLedger's tries: only the few messages of one
// job ever write its entry.
const maxLedgerWrites = 8

var errLedgerContended = errors.New("the entry kept changing while it was written")

// keepGuards takes into le, about to be written over stored, what stored
// holds that stops a repeat: the records of copies and their claims, a
// give-up, a send whose event was not stored, a failed attempt that may
// have reached the recipient, a lost answer. le's own outcome (Seq,
// Delivery) stays: it is the newer.
func (le *ledgerEntry) keepGuards(stored *ledgerEntry) {
	le.rev = stored.rev
	var handoffs []handoff
	for _, h := range stored.Handoffs {
		if mine := le.handoffNamed(h.MsgID); mine != nil && mine.Claimed != 0 {
			h.Claimed = mine.Claimed
		}
		handoffs = append(handoffs, h)
	}
	for _, h := range le.Handoffs {
		if stored.handoffNamed(h.MsgID) == nil {
			handoffs = append(handoffs, h)
		}
	}
	if n := len(handoffs); n > maxHandoffs {
		handoffs = handoffs[n-maxHandoffs:]
	}
	le.Handoffs = handoffs
	if stored.GivenUp && (!le.GivenUp || stored.Generation > le.Generation) {
		le.GivenUp, le.Generation = true, stored.Generation
	}
	if stored.State == "sent" && le.State != "sent" {
		le.State, le.Account, le.Attempt, le.ProviderID, le.At = stored.State, stored.Account, stored.Attempt, stored.ProviderID, stored.At
	}
	le.MaybeSent = le.MaybeSent || stored.MaybeSent
	for _, a := range stored.History {
		if !slices.ContainsFunc(le.History, func(b contract.AttemptError) bool { return b.Attempt == a.Attempt && b.At.Equal(a.At) }) {
			le.History = append(le.History, a)
		}
	}
	slices.SortStableFunc(le.History, func(a, b contract.AttemptError) int { return a.At.Compare(b.At) })
	if len(le.History) > maxHistory {
		le.History = le.History[len(le.History)-maxHistory:]
	}
}

// settledLast reports whether the last outcome the entry holds is that of
// delivery n of the JOBS message at stream sequence seq.
func (le *ledgerEntry) settledLast(seq, n uint64) bool {
	return n > 0 && le.Seq == seq && le.Delivery == n
}

// lastAttempt is the highest attempt the entry knows of (0: none).
func (le *ledgerEntry) lastAttempt() int {
	last := le.Attempt
	for _, a := range le.History {
		last = max(last, a.Attempt)
	}
	return last
}

// addAttempt appends a failed attempt, made by delivery n of the JOBS
// message at stream sequence seq, to the entry's history; maybeSent is
// whether that delivery may have followed a send whose answer was lost.
func (le *ledgerEntry) addAttempt(a contract.AttemptError, seq, n uint64, maybeSent bool) {
	le.State = "retrying"
	le.Seq, le.Delivery = seq, n
	le.MaybeSent = le.MaybeSent || maybeSent
	le.History = append(le.History, a)
	if len(le.History) > maxHistory {
		le.History = le.History[len(le.History)-maxHistory:]
	}
}

// mayHaveReached reports whether an attempt the entry holds may have
// reached the recipient though it failed: it timed out.
func (le *ledgerEntry) mayHaveReached() bool {
	return slices.ContainsFunc(le.History, func(a contract.AttemptError) bool { return a.Code == "timeout" })
}

// sessionEnded reports whether err hands a job back because the account's
// session here ended: a stop, a hand-over, a lost lease.
func sessionEnded(ctx context.Context, err error) bool {
	return errors.Is(err, errSchedStopped) || errors.Is(err, lease.ErrLost) || ctx.Err() != nil
}

// noteLeftUnsent records in the job's ledger entry that delivery d ends
// without a call, handed back at its session's end. Its redelivery then
// finds its previous delivery settled and does not take it for one whose
// answer was lost: without the record its outcomes would say maybe_sent,
// and one that then ended unsent would keep its frequency-cap reservation.
// A delivery that followed a lost answer passes the mark on in the entry.
// Not recorded (the write failed), the redelivery is as cautious as after
// a crash.
func (r *accountRunner) noteLeftUnsent(d *delivery) {
	le := d.entry
	if le.State == "sent" || le.GivenUp || le.handedOff(d.seq) != nil {
		return
	}
	if h := le.handoffNamed(d.copyOf); d.copyOf != "" && h != nil && h.Claimed != 0 && h.Claimed != d.seq {
		return // a second copy (claimCopy): the entry is the first one's
	}
	le.Seq, le.Delivery = d.seq, max(d.delivered, d.claim.deliveredThrough())
	le.MaybeSent = le.MaybeSent || d.job.MaybeSent
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 2*time.Second)
	defer cancel()
	if err := r.svc.writeLedger(ctx, &d.job, le); err != nil {
		d.log.Debug("could not record the job as left unsent; its redelivery will say maybe_sent", "err", err)
	}
}
