package shared

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher publishes to JetStream streams without waiting, like
// jetstream's PublishAsync, for the pipeline's hot paths (render's jobs,
// dispatch's sent events). PublishAsync decodes every ack with
// encoding/json, arms a timer per message and builds its options and
// futures on the heap; this reads an ordinary pub ack without decoding it
// and sweeps timeouts with one ticker: 28 instead of 40 allocations for a
// job, 19 instead of 27 for a sent event (no header, so no nats.Msg), the
// server's included (BenchmarkPublish). Semantics follow PublishAsync: a message counts as
// stored only once its stream acknowledged it (a duplicate of a stored
// Nats-Msg-Id counts as stored), "no responders" is retried twice a
// quarter second apart, and a disconnect fails everything pending, since
// its acks may never come.
//
// One goroutine writes the messages to the connection, in the order they
// were published, so the publishers of a busy process (a dispatch with a
// thousand accounts sending) do not queue on the connection's lock ahead
// of its reader and the answers to its requests, lease refreshes among
// them.
type Publisher struct {
	nc      *nats.Conn
	prefix  string // reply subjects are prefix + id
	timeout time.Duration
	space   chan struct{}     // one token per message awaiting its ack
	out     chan *Publication // published, not yet written (as many as space)
	sub     *nats.Subscription
	status  chan nats.Status
	stop    chan struct{} // closed by Close
	done    sync.WaitGroup
	// publishing is held (shared) by Publish calls, so Close can wait for
	// those in progress before it closes out.
	publishing sync.RWMutex
	closeOnce  sync.Once

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*Publication
}

// Publication is one message on its way into a stream.
type Publication struct {
	done chan struct{}
	err  error
	// What is (re)published; a nats.Msg is built only for a header.
	subject, reply string
	data           []byte
	header         nats.Header
	since          time.Time // the latest (re)publish
	tries          int
}

// Wait blocks until the stream stored the message (nil), refused it, or
// it timed out, or until ctx ends.
func (p *Publication) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrPublisherClosed fails publications still pending when their
// publisher closes.
var ErrPublisherClosed = errors.New("publisher closed before the stream acknowledged")

const (
	noResponderRetries = 2
	noResponderWait    = 250 * time.Millisecond
)

// NewPublisher starts a publisher on nc. At most maxPending messages await
// their acks at once (Publish waits for room); a message not acknowledged
// within timeout fails with jetstream.ErrAsyncPublishTimeout.
func NewPublisher(nc *nats.Conn, maxPending int, timeout time.Duration) (*Publisher, error) {
	p := &Publisher{
		nc:      nc,
		prefix:  nc.NewInbox() + ".",
		timeout: timeout,
		space:   make(chan struct{}, maxPending),
		out:     make(chan *Publication, maxPending),
		stop:    make(chan struct{}),
		pending: make(map[uint64]*Publication),
	}
	sub, err := nc.Subscribe(p.prefix+"*", p.handleAck)
	if err != nil {
		return nil, err
	}
	// Acks arrive at the publish rate; the default pending limit of a
	// subscription (65,536 messages) would drop them behind a busy
	// handler and fail stored messages by timeout.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	p.sub = sub
	p.status = nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	p.done.Go(p.watch)
	p.done.Go(p.write)
	return p, nil
}

// Publish sends data to subject, with a Nats-Msg-Id when msgID is set.
// data must not change until the publication is done. It waits while
// maxPending messages are unacknowledged. The message is written to the
// connection after Publish returns (write); a failure to write fails the
// publication.
func (p *Publisher) Publish(ctx context.Context, subject string, data []byte, msgID string) (*Publication, error) {
	p.publishing.RLock()
	defer p.publishing.RUnlock()
	if p.stopped() {
		return nil, ErrPublisherClosed
	}
	select {
	case p.space <- struct{}{}:
	default:
		select {
		case p.space <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.stop:
			return nil, ErrPublisherClosed
		}
	}
	pub := &Publication{done: make(chan struct{}), subject: subject, data: data}
	if msgID != "" {
		pub.header = nats.Header{jetstream.MsgIDHeader: []string{msgID}}
	}
	p.out <- pub // never blocks: out holds as many as space
	return pub, nil
}

// write registers each published message (its reply subject names it)
// and writes it to the connection, until Close closes out; a message it
// comes to after Close began fails as closed.
func (p *Publisher) write() {
	for pub := range p.out {
		// Checked under mu: watch fails what is pending once stop is
		// closed, taking mu after, so none is registered past it.
		p.mu.Lock()
		if p.stopped() {
			p.mu.Unlock()
			p.settle(pub, ErrPublisherClosed)
			continue
		}
		id := p.next
		p.next++
		pub.reply = p.prefix + strconv.FormatUint(id, 36)
		pub.since = time.Now()
		p.pending[id] = pub
		p.mu.Unlock()
		if err := p.send(pub); err != nil {
			// Settled once, here or by a disconnect that failed it
			// meanwhile.
			p.fail(id, pub, err)
		}
	}
}

// handleAck settles the publication an ack (or a refusal) is for.
func (p *Publisher) handleAck(m *nats.Msg) {
	id, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, p.prefix), 36, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	pub := p.pending[id]
	if pub == nil { // timed out or failed by a disconnect already
		p.mu.Unlock()
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" && pub.tries < noResponderRetries {
		// No stream answered (yet): during a leader election or before the
		// stream exists. Try again shortly, as PublishAsync does.
		pub.tries++
		pub.since = time.Now().Add(noResponderWait)
		p.mu.Unlock()
		time.AfterFunc(noResponderWait, func() { p.republish(id, pub) })
		return
	}
	delete(p.pending, id)
	p.mu.Unlock()
	p.settle(pub, ackError(m))
}

func (p *Publisher) republish(id uint64, pub *Publication) {
	p.mu.Lock()
	live := p.pending[id] == pub
	p.mu.Unlock()
	if !live {
		return
	}
	if err := p.send(pub); err != nil {
		p.fail(id, pub, err)
	}
}

func (p *Publisher) send(pub *Publication) error {
	if pub.header == nil {
		return p.nc.PublishRequest(pub.subject, pub.reply, pub.data)
	}
	return p.nc.PublishMsg(&nats.Msg{Subject: pub.subject, Reply: pub.reply, Header: pub.header, Data: pub.data})
}

// ackError reads a stream's answer: nil for a pub ack (duplicates
// included), the API error it carries, or why it is no ack.
func ackError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return jetstream.ErrNoStreamResponse
		}
		return jetstream.ErrInvalidJSAck
	}
	// A pub ack is {"stream":…,"seq":…[,"duplicate":true]}: skip the
	// decoding unless the answer says more.
	if !bytes.Contains(m.Data, []byte(`"error"`)) {
		if bytes.HasPrefix(m.Data, []byte(`{"stream":"`)) && bytes.Contains(m.Data, []byte(`"seq":`)) {
			return nil
		}
	}
	var resp struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return resp.Error
	}
	if resp.Stream == "" {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}

func (p *Publisher) settle(pub *Publication, err error) {
	pub.err = err
	<-p.space // room before the news, so Pending never counts a settled one
	close(pub.done)
}

func (p *Publisher) fail(id uint64, pub *Publication, err error) {
	p.mu.Lock()
	live := p.pending[id] == pub
	if live {
		delete(p.pending, id)
	}
	p.mu.Unlock()
	if live {
		p.settle(pub, err)
	}
}

// watch fails what timed out, and everything pending on a disconnect.
func (p *Publisher) watch() {
	status := p.status
	tick := time.NewTicker(max(p.timeout/8, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.failAll(func(*Publication) bool { return true }, ErrPublisherClosed)
			return
		case _, ok := <-status:
			if !ok {
				status = nil
				continue
			}
			// Acks of messages in flight are lost with the connection; the
			// messages may or may not be stored.
			p.failAll(func(*Publication) bool { return true }, nats.ErrDisconnected)
		case now := <-tick.C:
			p.failAll(func(pub *Publication) bool { return now.Sub(pub.since) >= p.timeout }, jetstream.ErrAsyncPublishTimeout)
		}
	}
}

func (p *Publisher) failAll(match func(*Publication) bool, err error) {
	var failed []*Publication
	p.mu.Lock()
	for id, pub := range p.pending {
		if match(pub) {
			delete(p.pending, id)
			failed = append(failed, pub)
		}
	}
	p.mu.Unlock()
	for _, pub := range failed {
		p.settle(pub, err)
	}
}

// Pending is how many messages await their acks (written or not).
func (p *Publisher) Pending() int { return len(p.space) }

// stopped reports whether Close began.
func (p *Publisher) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// Close stops the publisher; publications still pending fail with
// ErrPublisherClosed. Publish calls after it fail the same way.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		_ = p.sub.Unsubscribe()
		close(p.stop) // Publish calls waiting for room return
		// Wait out the Publish calls in progress; later ones see stop.
		p.publishing.Lock()
		p.publishing.Unlock()
		close(p.out)
		p.done.Wait()
		p.nc.RemoveStatusListener(p.status)
	})
}
