package status

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// index queues a recipient's outcome for the recipient index (stream
// LOOKUP, contract/lookup.go) when the fold changed it, published with
// the next flush or once indexBatch entries wait (publishIndex): one entry per
// recipient and outcome, keyed by the hash of the recipient in its
// channel-independent form, so GET /api/lookup reads one subject. The
// fold does not wait for it (indexWriter); a loss is repaired when the
// event is folded again after a crash, and the message id drops what the
// stream has already. Call with s.mu held.
func (s *Service) index(p *partition, ev *contract.Event, changed bool) {
	if !changed || ev.Index < 0 || ev.To == "" {
		return
	}
	switch ev.Kind {
	case contract.EventSent, contract.EventFailed, contract.EventSkipped, contract.EventExpired,
		contract.EventCancelled, contract.EventDelivered, contract.EventRead, contract.EventUndelivered:
	default:
		return
	}
	to, err := suppress.Normalize(contract.ScopeAll, ev.To)
	if err != nil {
		return
	}
	data, err := contract.EncodeLookupEntry(&contract.LookupEntry{TaskID: ev.TaskID, JobID: ev.JobID, To: ev.To,
		Account: ev.Account, Kind: ev.Kind, Attempt: ev.Attempt, Code: ev.Code, Error: ev.Error, At: ev.At})
	if err != nil {
		return
	}
	id := ev.TaskID + ":" + strconv.Itoa(ev.Index) + ":" + string(ev.Kind) + ":" + strconv.Itoa(ev.Generation)
	p.pendingIndex = append(p.pendingIndex, indexEntry{subject: contract.LookupSubject(contract.RecipientHash(to)), data: data, msgID: id})
	if len(p.pendingIndex) >= indexBatch {
		s.publishIndex(p)
	}
}

// indexBatch is how many index entries wait for the next flush at most.
// Publishing them together, not one per event as it is folded, lets the
// client write them in one system call and the server read them in one:
// at a few thousand events a second each entry otherwise cost a write, a
// read and a wakeup of its own in this process and in the server.
const indexBatch = 1024

// publishIndex publishes the entries waiting since the last call. The
// fold loop calls it before each flush, so entries are no later than the
// progress they belong to. Call with s.mu held.
func (s *Service) publishIndex(p *partition) {
	if len(p.pendingIndex) == 0 {
		return
	}
	if s.indexer == nil {
		s.indexer = newIndexWriter(s.js)
	}
	for _, e := range p.pendingIndex {
		if err := s.indexer.publish(e); err != nil {
			s.log.Debug("recipient index entry not published", shared.KeySubject, e.subject, "err", err)
		}
	}
	clear(p.pendingIndex)
	p.pendingIndex = p.pendingIndex[:0]
}

// indexEntry is an index entry waiting to be published: its subject,
// encoded LookupEntry and Nats-Msg-Id.
type indexEntry struct {
	subject string
	data    []byte
	msgID   string
}

// indexWriter publishes index entries as plain NATS messages, which the
// stream stores without answering: an acknowledgement per entry, which
// nobody waits for, cost the server and this client about 10 µs per
// recipient. One entry in every ackEvery asks for an acknowledgement, and
// when more than inFlight of those are unanswered publish waits for the
// oldest: a connection's messages reach the stream in order, so that
// bounds how many entries wait in the server's ingest queue, which drops
// unacknowledged messages once full (100,000 by default), as a fold of a
// large backlog after a restart would otherwise fill it.
// The plain publishes reuse one message and header, which PublishMsg
// copies into the connection's buffer before it returns.
type indexWriter struct {
	js       jetstream.JetStream
	ackEvery int
	inFlight int
	timeout  time.Duration
	n        int
	acks     []jetstream.PubAckFuture
	plain    *nats.Msg
}

func newIndexWriter(js jetstream.JetStream) *indexWriter {
	return &indexWriter{js: js, ackEvery: 256, inFlight: 16, timeout: 5 * time.Second}
}

func (w *indexWriter) publish(e indexEntry) error {
	if w.n++; w.n%w.ackEvery != 0 {
		if w.plain == nil {
			w.plain = &nats.Msg{Header: nats.Header{jetstream.MsgIDHeader: make([]string, 1)}}
		}
		w.plain.Subject, w.plain.Data = e.subject, e.data
		w.plain.Header[jetstream.MsgIDHeader][0] = e.msgID
		return w.js.Conn().PublishMsg(w.plain)
	}
	m := &nats.Msg{Subject: e.subject, Data: e.data, Header: nats.Header{jetstream.MsgIDHeader: []string{e.msgID}}}
	f, err := w.js.PublishMsgAsync(m)
	if err != nil {
		return err
	}
	w.acks = append(w.acks, f)
	if len(w.acks) <= w.inFlight {
		return nil
	}
	oldest := w.acks[0]
	w.acks = w.acks[1:]
	select {
	case <-oldest.Ok():
		return nil
	case err := <-oldest.Err():
		return err
	case <-time.After(w.timeout):
		return jetstream.ErrAsyncPublishTimeout
	}
}
