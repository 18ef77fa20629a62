package feedback

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// indexConsumerConfig reads every sent event. A new consumer starts at
// the sent events providers may still report on (ReceiptRetention ago),
// not at the start of EVENTS' 30 days.
func indexConsumerConfig(concurrency int) jetstream.ConsumerConfig {
	start := time.Now().Add(-shared.ReceiptRetention)
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerFeedbackIndex,
		Description:   "feedback: indexes the provider ids of sent events",
		FilterSubject: contract.SubjectEventsPrefix + "*." + string(contract.EventSent),
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       10 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 4 * concurrency,
	}
}

// indexConsumer returns the index consumer, creating it when missing. An
// existing one is kept as it is: its start time cannot be changed, and it
// is where it is.
func (s *Service) indexConsumer(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := s.js.Consumer(ctx, contract.StreamEvents, contract.ConsumerFeedbackIndex)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return s.js.CreateConsumer(ctx, contract.StreamEvents, indexConsumerConfig(s.cfg.Concurrency))
	}
	return cons, err
}

// indexKeys are the keys a sent event is found by: its provider id; for a
// webhook account also its job id, which the gateway got as
// Idempotency-Key and reports receipts by; for an SMTP account its
// recipient, so a bounce (which names only the address) finds the most
// recent send to it. An account feedback does not know (deleted) gets the
// job id too.
func indexKeys(ev *contract.Event, channel string) []string {
	if ev.CarriedBy != "" && ev.CarriedBy != ev.JobID {
		// A digest item: its message is the carrier's, found by the
		// carrier's keys; the item is kept beside them.
		carrier := *ev
		carrier.JobID, carrier.CarriedBy, carrier.To = ev.CarriedBy, "", ""
		var keys []string
		for _, k := range indexKeys(&carrier, channel) {
			keys = append(keys, digestItemKey(k, ev.JobID))
		}
		return keys
	}
	var keys []string
	if ev.ProviderID != "" && len(ev.ProviderID) <= maxIDBytes {
		keys = append(keys, idKey(ev.Account, ev.ProviderID))
	}
	if (channel == "webhook" || channel == "") && ev.JobID != "" && ev.JobID != ev.ProviderID {
		keys = append(keys, idKey(ev.Account, ev.JobID))
	}
	if channel == "smtp" && ev.To != "" {
		keys = append(keys, emailKey(ev.To))
	}
	return keys
}

// indexSent writes a sent event's keys into broadcast_provider_ids. The
// value names task, recipient and attempt, never the recipient's address
// or any secret. A later send of the same key (a retry-dead send, a newer
// email to the same address) replaces it.
func (s *Service) indexSent(ctx context.Context, m jetstream.Msg) error {
	var ev contract.Event
	if err := contract.DecodeEvent(m.Data(), &ev); err != nil || ev.Kind != contract.EventSent ||
		!contract.ValidID(ev.TaskID) || !contract.ValidID(ev.Account) || ev.Index < 0 {
		s.log.Warn("sent event does not decode; not indexed", shared.KeySubject, m.Subject(), "err", err)
		return nil
	}
	keys := indexKeys(&ev, s.accounts.channel(ev.Account))
	if len(keys) == 0 {
		return nil
	}
	data, err := json.Marshal(indexEntry{TaskID: ev.TaskID, JobID: ev.JobID, Index: ev.Index, Account: ev.Account,
		Attempt: ev.Attempt, Generation: ev.Generation, DigestSize: ev.DigestSize})
	if err != nil {
		return shared.Permanent(err)
	}
	for _, k := range keys {
		if _, err := s.index.Put(ctx, k, data); err != nil {
			return err
		}
	}
	s.cfg.metrics.Indexed()
	s.indexed.Add(1)
	return nil
}
