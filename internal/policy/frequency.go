package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// Counter keeps the per-recipient send counts behind the frequency caps
// in KV broadcast_frequency, one key per channel and recipient hash, each
// change a compare-and-set on the key's revision. Every dispatch replica
// reads and writes the same record, so a cap holds across replicas and
// restarts; nothing is kept in memory.
//
// The rule: a send is reserved, by its job id, before the provider call
// and counts from then on. A delivery that finds its own job's
// reservation (a redelivery after a crash, a retry, a job back from a
// wait or moved to another account) uses it and does not count again, so
// a crash between the reservation and the send neither counts twice nor
// skips the job it reserved for. A call that failed without reaching the
// recipient releases it (the retry reserves again). A reservation whose
// job never sends after all (a crash, then expiry or cancellation) keeps
// counting until its window passes: the error is a later message skipped,
// never a cap exceeded.
type Counter struct {
	kv jetstream.KeyValue
}

// maxConflicts bounds the compare-and-set retries of one change; each
// conflict means another replica changed the same recipient's record.
const maxConflicts = 50

// OpenCounter opens KV broadcast_frequency.
func OpenCounter(ctx context.Context, js jetstream.JetStream) (*Counter, error) {
	kv, err := js.KeyValue(ctx, contract.BucketFrequency)
	if err != nil {
		return nil, fmt.Errorf("%s bucket: %w", contract.BucketFrequency, err)
	}
	return &Counter{kv: kv}, nil
}

// Key is the record key of a recipient, as normalized by its channel.
func Key(channel, to string) string { return channel + "." + contract.RecipientHash(to) }

// Over is a cap a reservation would exceed.
type Over struct {
	Cap   contract.FrequencyCap
	Count int // the sends it counts in its window
}

// Explain is the skipped event's error: the cap and its count, not the
// recipient.
func (o *Over) Explain() string {
	return fmt.Sprintf("frequency cap reached (%s): %d sent in the window", o.Cap.Describe(), o.Count)
}

// Reserve reserves a send of job (category cat) to `to` at now under
// caps, or returns the first cap it would exceed. Reserving again for a
// job that holds a reservation succeeds without counting twice. Records
// are pruned of sends older than the longest cap window.
func (c *Counter) Reserve(ctx context.Context, channel, to, job string, cat contract.Category, caps []contract.FrequencyCap, now time.Time) (*Over, error) {
	key := Key(channel, to)
	var longest time.Duration
	for i := range caps {
		longest = max(longest, caps[i].WindowDuration())
	}
	mine := contract.FrequencySend{Job: job, Category: cat, At: now.Unix()}
	// A recipient without a record has room under every cap (max is at
	// least 1): creating it first is one round trip instead of two, the
	// case of every recipient new within the windows.
	if ok, err := c.write(ctx, key, contract.FrequencyRecord{Sends: []contract.FrequencySend{mine}}, 0); err != nil || ok {
		return nil, err
	}
	for range maxConflicts {
		rec, rev, err := c.read(ctx, key)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(rec.Sends, func(s contract.FrequencySend) bool { return s.Job == job }) {
			return nil, nil
		}
		cutoff := now.Add(-longest).Unix()
		rec.Sends = slices.DeleteFunc(rec.Sends, func(s contract.FrequencySend) bool { return s.At <= cutoff })
		for i := range caps {
			cp := &caps[i]
			if !cp.Applies(cat) {
				continue
			}
			from, n := now.Add(-cp.WindowDuration()).Unix(), 0
			for _, s := range rec.Sends {
				if s.At > from && cp.Applies(s.Category) {
					n++
				}
			}
			if n >= cp.Max {
				return &Over{Cap: *cp, Count: n}, nil
			}
		}
		rec.Sends = append(rec.Sends, mine)
		if ok, err := c.write(ctx, key, rec, rev); err != nil || ok {
			return nil, err
		}
	}
	return nil, fmt.Errorf("frequency record %s: still changing after %d tries", key, maxConflicts)
}

// Release drops job's reservation for `to`, if it holds one.
func (c *Counter) Release(ctx context.Context, channel, to, job string) error {
	key := Key(channel, to)
	for range maxConflicts {
		rec, rev, err := c.read(ctx, key)
		if err != nil {
			return err
		}
		n := len(rec.Sends)
		rec.Sends = slices.DeleteFunc(rec.Sends, func(s contract.FrequencySend) bool { return s.Job == job })
		if len(rec.Sends) == n {
			return nil
		}
		if ok, err := c.write(ctx, key, rec, rev); err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("frequency record %s: still changing after %d tries", key, maxConflicts)
}

// Sends returns the record of `to` (for tests and inspection).
func (c *Counter) Sends(ctx context.Context, channel, to string) ([]contract.FrequencySend, error) {
	rec, _, err := c.read(ctx, Key(channel, to))
	return rec.Sends, err
}

// read returns key's record and revision, 0 when there is none. A value
// that does not decode reads as empty and is replaced by the next write.
func (c *Counter) read(ctx context.Context, key string) (contract.FrequencyRecord, uint64, error) {
	var rec contract.FrequencyRecord
	e, err := c.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, 0, nil
	}
	if err != nil {
		return rec, 0, fmt.Errorf("frequency record: %w", err)
	}
	_ = json.Unmarshal(e.Value(), &rec)
	return rec, e.Revision(), nil
}

// write stores rec if key is still at rev (0: absent); ok is false when
// another writer came first.
func (c *Counter) write(ctx context.Context, key string, rec contract.FrequencyRecord, rev uint64) (ok bool, err error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	if rev == 0 {
		_, err = c.kv.Create(ctx, key, data)
	} else {
		_, err = c.kv.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("frequency record: %w", err)
	}
	return true, nil
}
