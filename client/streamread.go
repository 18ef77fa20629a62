package client

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readSubject calls fn with every message of stream on filter from
// sequence from (0 or 1 for the start), in stream order, until fn returns
// false or the messages that matched when it started are read. It reads
// through a short-lived consumer that acknowledges nothing, so it sees
// only what the filter matches (a literal subject is found through the
// stream's per-subject index, not by reading the others).
func readSubject(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, fn func(seq uint64, data []byte) bool) error {
	cfg := jetstream.ConsumerConfig{FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy,
		InactiveThreshold: 30 * time.Second, MemoryStorage: true}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = js.DeleteConsumer(context.WithoutCancel(ctx), stream, cons.CachedInfo().Name) }()
	pending := cons.CachedInfo().NumPending
	for read := uint64(0); read < pending; {
		batch, err := cons.Fetch(int(min(500, pending-read)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			if !fn(meta.Sequence.Stream, m.Data()) {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if got == 0 {
			return nil
		}
	}
	return nil
}
