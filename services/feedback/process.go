package feedback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/shared"
)

// receiptConsumerConfig reads RECEIPTS. Receipts waiting for their sent
// event are held with NakWithDelay and keep an ack-pending slot each, so
// the cap is far above the handlers' concurrency.
func receiptConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerFeedback,
		Description:   "feedback: turns provider receipts into events",
		FilterSubject: contract.SubjectReceiptsPrefix + ">",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       10 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 20_000,
	}
}

// eventKind is the event a receipt becomes, if any. Positive evidence of
// arrival is delivered or read; a failure after acceptance is undelivered.
// A complaint says the mail arrived (and was unwanted): delivered, with
// code "complaint". A soft bounce is transient (the sending server keeps
// trying) and a WhatsApp "sent" repeats what dispatch knew: neither makes
// an event.
func eventKind(rc *Receipt) (contract.EventKind, string, bool) {
	switch rc.Status {
	case StatusDelivered:
		return contract.EventDelivered, rc.Code, true
	case StatusRead:
		return contract.EventRead, rc.Code, true
	case StatusFailed:
		return contract.EventUndelivered, rc.Code, true
	case BounceHard:
		return contract.EventUndelivered, "hard_bounce", true
	case BounceComplaint:
		return contract.EventDelivered, "complaint", true
	}
	return "", "", false
}

// handleReceipt matches a stored receipt to its sent event through the
// index and publishes its event. The event's Nats-Msg-Id (job, kind,
// attempt) makes a receipt handled twice, or reported twice, one event;
// status folds a later repeat idempotently.
func (s *Service) handleReceipt(ctx context.Context, m jetstream.Msg) error {
	var rc Receipt
	if err := json.Unmarshal(m.Data(), &rc); err != nil {
		s.log.Warn("receipt does not decode; dropped", shared.KeySubject, m.Subject(), "err", err)
		return nil
	}
	if err := s.suppressFrom(ctx, &rc); err != nil {
		return err
	}
	kind, code, ok := eventKind(&rc)
	if !ok {
		s.cfg.metrics.Receipt(rc.Source, metrics.ReceiptIgnored, 1)
		return nil
	}
	key := idKey(rc.Account, rc.ID)
	if rc.Source == SourceBounce {
		key = emailKey(rc.Email)
	}
	e, err := s.index.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.notIndexed(ctx, m, &rc)
	}
	if err != nil {
		return err
	}
	var entry indexEntry
	if err := json.Unmarshal(e.Value(), &entry); err != nil || !contract.ValidID(entry.TaskID) {
		s.log.Warn("index entry does not decode; receipt dropped", "key", key, "err", err)
		return nil
	}
	entries := []indexEntry{entry}
	if entry.DigestSize > 1 {
		items, err := s.digestItems(ctx, key)
		if err != nil {
			return err
		}
		entries = append(entries, items...)
	}
	for _, en := range entries {
		ev := contract.Event{TaskID: en.TaskID, JobID: en.JobID, Index: en.Index, Account: en.Account,
			Kind: kind, Attempt: en.Attempt, Generation: en.Generation, Code: code, Error: rc.Error,
			At: rc.At, ProviderID: rc.ID, To: rc.Email}
		if err := shared.PublishEvent(ctx, s.js, &ev); err != nil {
			return fmt.Errorf("publish %s event: %w", kind, err)
		}
		s.cfg.metrics.Receipt(rc.Source, metrics.ReceiptEvent, 1)
		s.published.Add(1)
	}
	if len(entries) < entry.DigestSize && (time.Since(rc.Received) < s.cfg.MatchWait || s.indexBehind(ctx)) {
		// Some items' sent events are not indexed yet: try again; the
		// events already published are dropped as duplicates.
		return shared.RetryAfter(s.cfg.MatchRetry, errors.New("digest items not all indexed yet"))
	}
	return nil
}

// digestItems returns the entries of the items a digest carrier's message,
// under key, carried besides the carrier.
func (s *Service) digestItems(ctx context.Context, key string) ([]indexEntry, error) {
	lister, err := s.index.ListKeysFiltered(ctx, key+".*")
	if err != nil {
		return nil, err
	}
	var out []indexEntry
	for k := range lister.Keys() {
		e, err := s.index.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var en indexEntry
		if json.Unmarshal(e.Value(), &en) == nil && contract.ValidID(en.TaskID) {
			out = append(out, en)
		}
	}
	return out, nil
}

// maxMatchDelay caps the growing delay between tries of an unmatched receipt.
const maxMatchDelay = 30 * time.Second

// notIndexed handles a receipt whose id is not in the index: it raced
// ahead of its sent event (the provider reported before dispatch's event
// was indexed), so it is tried again with a growing delay, for MatchWait
// and for as long as the index has sent events left to read. Then it is
// counted unmatched and logged: a message Broadcast did not send (another
// system on the same number), or one sent longer ago than the index keeps.
func (s *Service) notIndexed(ctx context.Context, m jetstream.Msg, rc *Receipt) error {
	if time.Since(rc.Received) < s.cfg.MatchWait || s.indexBehind(ctx) {
		tries := uint64(1)
		if meta, err := m.Metadata(); err == nil {
			tries = max(meta.NumDelivered, 1)
		}
		delay := min(s.cfg.MatchRetry<<min(tries-1, 10), maxMatchDelay)
		return shared.RetryAfter(delay, errors.New("receipt's id is not indexed yet"))
	}
	s.cfg.metrics.Receipt(rc.Source, metrics.ReceiptUnmatched, 1)
	s.unmatched.Add(1)
	s.log.Warn("receipt matches no sent event; counted unmatched", "source", rc.Source, shared.KeyAccount, rc.Account,
		"status", rc.Status, "received", rc.Received)
	return nil
}

// behindCache remembers for a second whether the index consumer has sent
// events left, so a flood of unmatched receipts asks the server once.
type behindCache struct {
	mu     sync.Mutex
	at     time.Time
	behind bool
}

// indexBehind reports whether the index consumer has sent events it has
// not indexed yet (or the server cannot say: then it is assumed behind).
func (s *Service) indexBehind(ctx context.Context) bool {
	s.behind.mu.Lock()
	defer s.behind.mu.Unlock()
	if time.Since(s.behind.at) < time.Second {
		return s.behind.behind
	}
	behind := true
	if cons, err := s.js.Consumer(ctx, contract.StreamEvents, contract.ConsumerFeedbackIndex); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			behind = info.NumPending > 0 || info.NumAckPending > 0
		}
	}
	s.behind.at, s.behind.behind = time.Now(), behind
	return behind
}
