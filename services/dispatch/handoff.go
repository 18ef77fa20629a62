package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// A delivery that hands its job on as a copy (parked, moved to another
// account, or scheduled to come back) publishes the copy and then has its
// message acknowledged. Killed in between, its message comes back, and the
// copy and the original would be two live jobs that may both pass
// sentBefore and send. So a copy is recorded first in the job's ledger
// entry, by the original's stream sequence, and published with a
// Nats-Msg-Id naming that sequence: a redelivery of the original finds the
// record, publishes the same copy again (JOBS's duplicate window, 2 min,
// drops it, or it is stored now if the crash came before the publish) and
// is acknowledged without sending, whatever the task or account state is
// now. Ids by sequence let a later copy of the job (a new message) be
// parked or moved again.
//
// The duplicate window does not always drop the copy published again: a
// server restart rebuilds it from the messages still stored, and a copy
// that was consumed, or a schedule that fired (the message it makes has no
// Nats-Msg-Id), is not among them. So each copy carries its record's id in
// a header (copyHeader), and the first delivery of a message with it
// claims the record by compare-and-set (claimCopy): a second copy finds
// the record claimed by another message and is acknowledged without a
// step. A redelivered original whose copy was claimed already publishes
// nothing (sentBefore): a delay copy published again would land on the
// job's schedule subject, where its next copy may wait, and replace that
// schedule. One that read the record unclaimed publishes a scheduled copy
// only onto an empty schedule subject (republishCopy), as the copy may be
// claimed and delayed again meanwhile.

// copyHeader names, on a copy's message, the Nats-Msg-Id of the handoff
// record it is the copy of (contract.HeaderCopyOf). Schedules keep it when
// they fire, and the re-queues of parked and held copies carry it on
// (requeueCopy), so two lane messages of one copy, however they came, are
// told apart.
const copyHeader = contract.HeaderCopyOf

// handoff is a copy a delivery published in place of its message.
type handoff struct {
	// Seq is the stream sequence of the message handed off.
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	MsgID   string `json:"msg_id"`
	// Claimed is the stream sequence of the message delivered first as
	// the copy (claimCopy); 0 until then.
	Claimed uint64 `json:"claimed,omitempty"`
	// The copy is the message's job with these (not the job itself: the
	// entry must stay small whatever the body).
	Account   string `json:"account"`
	Attempts  int    `json:"attempts,omitempty"`
	Moves     int    `json:"moves,omitempty"`
	MaybeSent bool   `json:"maybe_sent,omitempty"`
	// At and Target make it a scheduled message (delay.go).
	At     time.Time `json:"at,omitzero"`
	Target string    `json:"target,omitempty"`
}

// copyOf is the copy of job, the message's job, that h records.
func (h *handoff) copyOf(job contract.Job) *contract.Job {
	job.Account, job.Attempts, job.Moves, job.MaybeSent, job.Recheck = h.Account, h.Attempts, h.Moves, h.MaybeSent, true
	return &job
}

// maxHandoffs bounds the copies an entry remembers: a later copy may be
// handed off again (resumed and paused) before a crashed original's
// redelivery reads the entry.
const maxHandoffs = 4

// handOff publishes cp on subject in place of d's message, recorded first
// in the ledger; at and target, when set, schedule it.
func (r *accountRunner) handOff(ctx context.Context, d *delivery, action, subject string, cp *contract.Job, at time.Time, target string) error {
	h := handoff{Seq: d.seq, Subject: subject, MsgID: fmt.Sprintf("%s:%s:%d", d.job.MsgID(), action, d.seq),
		Account: cp.Account, Attempts: cp.Attempts, Moves: cp.Moves, MaybeSent: cp.MaybeSent, At: at, Target: target}
	d.entry.Handoffs = append(d.entry.Handoffs, h)
	if n := len(d.entry.Handoffs); n > maxHandoffs {
		d.entry.Handoffs = d.entry.Handoffs[n-maxHandoffs:]
	}
	if err := r.svc.writeLedger(ctx, &d.job, d.entry); err != nil {
		return fmt.Errorf("ledger: record the job's copy: %w", err)
	}
	return r.svc.publishCopy(ctx, &h, cp)
}

// republishCopy publishes again the copy h records, for an original that
// came back without knowing whether its publish was stored. A scheduled
// copy is published only onto an empty schedule subject: anything there is
// this copy's schedule not yet fired or a later copy's, which a schedule
// published now would replace (a schedule rolls its subject up). Its
// record's claim, read just before, cannot say which: the copy may fire,
// be claimed and be delayed again between that read and this publish.
func (s *Service) republishCopy(ctx context.Context, h *handoff, cp *contract.Job) error {
	if h.Target == "" {
		return s.publishCopy(ctx, h, cp)
	}
	err := s.publishCopy(ctx, h, cp, jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return nil // a copy waits there: this one, or a later one
	}
	return err
}

// publishCopy publishes cp, the copy h records, with extra options.
func (s *Service) publishCopy(ctx context.Context, h *handoff, cp *contract.Job, extra ...jetstream.PublishOpt) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	opts := append([]jetstream.PublishOpt{jetstream.WithMsgID(h.MsgID)}, extra...)
	if h.Target != "" {
		// Again after a crash, maybe after its time: then come back now.
		at := h.At
		if soon := time.Now().Truncate(time.Second).Add(time.Second); at.Before(soon) {
			at = soon
		}
		opts = append(opts, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(h.Target))
	}
	msg := nats.NewMsg(h.Subject)
	msg.Data = data
	msg.Header.Set(copyHeader, h.MsgID)
	_, err = s.js.PublishMsg(ctx, msg, opts...)
	return err
}

// handoffNamed is the record whose copy's Nats-Msg-Id is id, if any.
func (le *ledgerEntry) handoffNamed(id string) *handoff {
	for i := range le.Handoffs {
		if le.Handoffs[i].MsgID == id {
			return &le.Handoffs[i]
		}
	}
	return nil
}

// claimCopy makes d's message the copy of the handoff record it names
// (d.copyOf), unless another message already is, and reads the job's
// ledger entry into d.entry. done reports that d is a second copy, to be
// acknowledged without a step. A record no longer kept (maxHandoffs) or
// never stored lets the copy go on, as before records were claimed.
func (r *accountRunner) claimCopy(ctx context.Context, d *delivery) (done bool, err error) {
	for {
		le, rev, err := r.svc.readLedgerRevision(ctx, &d.job)
		if err != nil {
			return true, fmt.Errorf("ledger: %w", err)
		}
		d.entry = le
		h := le.handoffNamed(d.copyOf)
		switch {
		case h == nil || h.Claimed == d.seq:
			return false, nil
		case h.Claimed != 0:
			d.log.Debug("another message is the copy this one repeats (published again after the duplicate window forgot it); not handling it",
				"copy", d.copyOf, "seq", d.seq, "claimed_by", h.Claimed)
			return true, nil
		}
		h.Claimed = d.seq
		err = r.svc.updateLedger(ctx, &d.job, le, rev)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return true, fmt.Errorf("ledger: claim the copy: %w", err)
		}
		// Changed since it was read (the other copy's claim, say): again.
	}
}

// handedOff is the copy the entry records for the message at seq, if any.
func (le *ledgerEntry) handedOff(seq uint64) *handoff {
	for i := range le.Handoffs {
		if le.Handoffs[i].Seq == seq {
			return &le.Handoffs[i]
		}
	}
	return nil
}
