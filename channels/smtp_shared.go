package channels

import (
	"context"
	"sync/atomic"

	gomail "github.com/wneessen/go-mail"

	"github.com/broadcastd/broadcast/contract"
)

// Shared connections: an account whose "connections" is below its
// concurrency keeps at most that many connections, and each carries up to
// depth = ⌈concurrency / connections⌉ transactions at once. Messages wait
// in one queue; a worker per connection takes what is waiting (up to
// depth) and, when the server offers PIPELINING and CHUNKING, writes
// their transactions in one write and reads the replies in order (RFC
// 2920 lets MAIL follow a BDAT in one group). Every transaction after a
// group's first, and the first after a refusal, starts with RSET, so a
// refused transaction leaves the next a clean session whatever state the
// server kept. Servers that cap connections per client (Exchange Online
// takes 3 at a time for SMTP AUTH) still get concurrency messages in flight,
// and near servers cost fewer writes and reads on both ends per message.
// A server without CHUNKING gets its transactions one at a time.
//
// A connection lost in a group leaves the messages whose replies had not
// come in doubt (retryable, as a lost final reply is), except that
// a pooled connection which answered nothing was closed before the group
// (the server hangs up idle clients): the group goes again at once on a
// fresh connection.

// smtpTxn is one message on its way through a shared connection. state
// settles who owns it: the worker that takes it sends it and answers on
// done; a sender that gives up first takes it back unsent.
type smtpTxn struct {
	e     *email
	state atomic.Int32
	done  chan Result
	// gate is the Send's gate (WithSendGate), asked once a connection is
	// ready for the message; nil when it has none.
	gate func() bool
}

const (
	txnQueued int32 = iota
	txnTaken
	txnWithdrawn
)

// sendShared is Send for an account with shared connections.
func (s *smtpSender) sendShared(ctx context.Context, msgs []Message) []Result {
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		out[i] = s.sendOne(ctx, m)
		if out[i].Class == contract.ClassAccountFatal {
			for j := i + 1; j < len(msgs); j++ {
				out[j] = out[i]
				out[j].ProviderID = ""
			}
			break
		}
	}
	return out
}

// sendOne queues one message for a shared connection and waits for its
// result. Its place among the account's concurrency is held until a
// worker is done with it, also when ctx ends first.
func (s *smtpSender) sendOne(ctx context.Context, m Message) Result {
	e, err := s.compose(m)
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "message", Err: clip(err.Error())}
	}
	t := &smtpTxn{e: e, done: make(chan Result, 1), gate: sendGate(ctx)}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return Result{Class: contract.ClassRetryable, Code: "timeout", Err: "smtp: " + ctx.Err().Error()}
	}
	s.enqueue(t)
	select {
	case r := <-t.done:
		return r
	case <-ctx.Done():
		if t.state.CompareAndSwap(txnQueued, txnWithdrawn) {
			<-s.slots
			return Result{Class: contract.ClassRetryable, Code: "timeout", Err: "smtp: " + ctx.Err().Error() + " (not sent)"}
		}
		return Result{Class: contract.ClassRetryable, Code: "timeout",
			Err: "smtp: " + ctx.Err().Error() + " while the message was on its way"}
	}
}

// enqueue queues t and wakes an idle worker, or starts one while fewer
// than connections run.
func (s *smtpSender) enqueue(t *smtpTxn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, t)
	switch {
	case s.waiting > 0:
		s.wake.Signal()
	case s.workers < s.connections:
		s.workers++
		go s.work()
	}
}

// finish answers t and frees its place.
func (s *smtpSender) finish(t *smtpTxn, r Result) {
	t.done <- r
	<-s.slots
}

// work is a shared connection's worker: it takes what waits, up to
// depth messages at a time, and sends them over its connection, until
// the sender is closed and nothing waits.
func (s *smtpSender) work() {
	var conn *smtpConn
	for {
		group := s.nextGroup()
		if group == nil {
			break
		}
		conn = s.carry(conn, group)
	}
	if conn != nil {
		_ = conn.UpdateDeadline(s.timeout)
		_ = conn.Quit()
		conn.close()
	}
}

// nextGroup waits for queued messages and takes up to depth of them; nil
// when the sender is closed and nothing waits.
func (s *smtpSender) nextGroup() []*smtpTxn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var group []*smtpTxn
		for len(s.queue) > 0 && len(group) < s.depth {
			t := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			if t.state.CompareAndSwap(txnQueued, txnTaken) {
				group = append(group, t)
			}
		}
		if len(group) > 0 {
			return group
		}
		if s.closed {
			s.workers--
			return nil
		}
		s.waiting++
		s.wake.Wait()
		s.waiting--
	}
}

// carry sends group over conn (dialling when it is nil), answers every
// message of it, and returns the connection to keep using.
func (s *smtpSender) carry(conn *smtpConn, group []*smtpTxn) *smtpConn {
	pooled := conn != nil
	if conn == nil {
		if conn = s.dialFor(group); conn == nil {
			return nil
		}
	}
	if group = s.passGate(group); len(group) == 0 {
		return conn
	}
	if !chunked(conn) {
		for _, t := range group {
			ctx := context.Background()
			if t.gate != nil {
				ctx = WithSendGate(ctx, t.gate)
			}
			var r Result
			r, conn = s.deliverEmail(ctx, conn, t.e)
			s.finish(t, r)
		}
		return conn
	}
	results, stale := s.transmitGroup(conn, group)
	if stale && pooled {
		conn.close()
		if conn = s.dialFor(group); conn == nil {
			return nil
		}
		if group = s.passGate(group); len(group) == 0 {
			return conn
		}
		results, _ = s.transmitGroup(conn, group)
	}
	for i, t := range group {
		s.finish(t, results[i])
	}
	if conn.broken {
		conn.close()
		return nil
	}
	return conn
}

// passGate answers GateClosed to each transaction of group whose gate is
// shut now that a connection is ready, and returns the others.
func (s *smtpSender) passGate(group []*smtpTxn) []*smtpTxn {
	open := group[:0]
	for _, t := range group {
		if gateOpen(t.gate) {
			open = append(open, t)
		} else {
			s.finish(t, GateClosed)
		}
	}
	return open
}

// dialFor dials a shared connection for group, bounded by the sender's
// timeout. When that fails it answers every message of group with the
// failure and returns nil.
func (s *smtpSender) dialFor(group []*smtpTxn) *smtpConn {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	conn, err := s.dial(ctx)
	if err != nil {
		r := s.dialFailure(err)
		for _, t := range group {
			s.finish(t, r)
		}
		return nil
	}
	return conn
}

// chunked reports whether conn's server takes pipelined BDAT transactions.
func chunked(conn *smtpConn) bool {
	ok, _ := conn.Extension("PIPELINING")
	ok2, _ := conn.Extension("CHUNKING")
	return ok && ok2
}

// transmitGroup writes group's transactions in one write and reads their
// replies in order. A failed transaction's result is classified as a
// single one's; those after a reply that never came are in doubt
// (retryable). stale says the connection took nothing: it could not be
// written to, or its first reply never came or was a 421 (the server had
// hung up, or says it is about to). conn.broken is set when the
// connection must go.
func (s *smtpSender) transmitGroup(conn *smtpConn, group []*smtpTxn) (results []Result, stale bool) {
	results = make([]Result, len(group))
	gone := func(err error) ([]Result, bool) {
		r, _ := s.sendFailure(err)
		for i := range results {
			results[i] = r
		}
		conn.broken = true
		return results, true
	}
	if err := conn.UpdateDeadline(s.timeout); err != nil {
		return gone(&smtpStepError{reason: gomail.ErrConnCheck, err: err})
	}
	// reset[i] says transaction i starts with RSET: every one after the
	// first, and the first after a refused one.
	reset := make([]bool, len(group))
	w := conn.Text.W
	for i, t := range group {
		if reset[i] = i > 0 || conn.dirty; reset[i] {
			_, _ = w.WriteString("RSET\r\n")
		}
		_, _ = w.WriteString(mailCommands(conn, t.e.from, t.e.to))
		writeChunk(w, t.e.data)
	}
	if err := w.Flush(); err != nil {
		return gone(&smtpStepError{reason: gomail.ErrSMTPMailFrom, err: err})
	}
	inDoubt := Result{Class: contract.ClassRetryable, Code: "network",
		Err: "smtp: the connection ended before this message's reply"}
	for i, t := range group {
		if conn.broken {
			results[i] = inDoubt
			continue
		}
		_ = conn.UpdateDeadline(s.timeout)
		if reset[i] {
			// A refused RSET says nothing of the transaction after it, whose
			// replies still come; the connection is not trusted again.
			if _, _, err := conn.Text.ReadResponse(250); err != nil {
				code := smtpReply(err)
				if i == 0 && (code == 0 || code == 421) {
					return gone(&smtpStepError{reason: gomail.ErrConnCheck, err: err})
				}
				conn.broken = true
				if !isReply(err) {
					results[i] = inDoubt
					continue
				}
			}
		}
		failed, _ := readReplies(conn.Text, replyStep{250, gomail.ErrSMTPMailFrom}, replyStep{25, gomail.ErrSMTPRcptTo},
			replyStep{250, gomail.ErrSMTPDataClose})
		if failed == nil {
			results[i] = Result{Code: "250", ProviderID: t.e.id}
			conn.dirty = false
			continue
		}
		if i == 0 && !reset[i] && staleConn(failed) {
			return gone(failed)
		}
		r, keep := s.sendFailure(failed)
		results[i], conn.dirty = r, true
		conn.broken = conn.broken || !keep
	}
	return results, false
}
