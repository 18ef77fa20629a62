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
	return c.ReserveMessage(ctx, channel, to, job, []contract.Category{cat}, caps, now)
}

// ReserveMessage is Reserve for one message carrying items of every
// category in cats (a digest): it needs room under every cap that limits
// any of them and counts once under each; the record names the strictest
// as the send's category (contract.FrequencySend). A job whose
// reservation already counts for all of cats reuses it; one whose
// reservation counts for fewer (it reserved alone before it carried a
// digest) has it widened to them, if the caps have room without it, and
// dated now, which keeps it in every window at least as long.
func (c *Counter) ReserveMessage(ctx context.Context, channel, to, job string, cats []contract.Category, caps []contract.FrequencyCap, now time.Time) (*Over, error) {
	if len(cats) == 0 {
		return nil, errors.New("frequency reservation without a category")
	}
	key := Key(channel, to)
	var longest time.Duration
	for i := range caps {
		longest = max(longest, caps[i].WindowDuration())
	}
	mine := message(job, cats, now)
	// A recipient without a record has room under every cap (max is at
	// least 1): creating it first is one round trip instead of two, the
	// case of every recipient new within the windows.
	if ok, err := c.write(ctx, key, contract.FrequencyRecord{Sends: []contract.FrequencySend{mine}}, 0); err != nil || ok {
		return nil, err
	}
	isMine := func(s contract.FrequencySend) bool { return s.Job == job }
	for range maxConflicts {
		rec, rev, err := c.read(ctx, key)
		if err != nil {
			return nil, err
		}
		if i := slices.IndexFunc(rec.Sends, isMine); i >= 0 {
			held := rec.Sends[i]
			if held.Covers(cats) {
				return nil, nil
			}
			mine = message(job, slices.Concat(cats, []contract.Category{held.Category}, held.Also), now)
		}
		cutoff := now.Add(-longest).Unix()
		rec.Sends = slices.DeleteFunc(rec.Sends, func(s contract.FrequencySend) bool { return s.At <= cutoff || s.Job == job })
		if over := firstOver(rec.Sends, cats, caps, now); over != nil {
			return over, nil
		}
		rec.Sends = append(rec.Sends, mine)
		if ok, err := c.write(ctx, key, rec, rev); err != nil || ok {
			return nil, err
		}
	}
	return nil, fmt.Errorf("frequency record %s: still changing after %d tries", key, maxConflicts)
}

// message is the reservation of job's message carrying cats at now: the
// strictest category (the order of contract.Categories) as its category,
// the others as Also.
func message(job string, cats []contract.Category, now time.Time) contract.FrequencySend {
	rank := func(c contract.Category) int {
		if i := slices.Index(contract.Categories, c); i >= 0 {
			return i
		}
		return len(contract.Categories)
	}
	var sorted []contract.Category
	for _, c := range cats {
		if !slices.Contains(sorted, c) {
			sorted = append(sorted, c)
		}
	}
	slices.SortStableFunc(sorted, func(a, b contract.Category) int { return rank(a) - rank(b) })
	return contract.FrequencySend{Job: job, Category: sorted[0], Also: sorted[1:], At: now.Unix()}
}

// firstOver is the first cap limiting any of cats that sends, at now,
// leave no room in.
func firstOver(sends []contract.FrequencySend, cats []contract.Category, caps []contract.FrequencyCap, now time.Time) *Over {
	for i := range caps {
		cp := &caps[i]
		if !slices.ContainsFunc(cats, cp.Applies) {
			continue
		}
		from, n := now.Add(-cp.WindowDuration()).Unix(), 0
		for j := range sends {
			if sends[j].At > from && sends[j].CountsFor(cp) {
				n++
			}
		}
		if n >= cp.Max {
			return &Over{Cap: *cp, Count: n}
		}
	}
	return nil
}

// Usage is a recipient's reserved sends as read once (Load), to check
// several messages against the caps without reserving.
type Usage struct {
	sends []contract.FrequencySend
}

// Load reads the sends reserved for `to` on channel.
func (c *Counter) Load(ctx context.Context, channel, to string) (*Usage, error) {
	rec, _, err := c.read(ctx, Key(channel, to))
	if err != nil {
		return nil, err
	}
	return &Usage{sends: rec.Sends}, nil
}

// Check returns the first cap a send of category cat at now would
// exceed, nil when every cap that limits cat has room. The reservations
// of the jobs in own do not count: they are the message's own (a
// reservation Reserve would reuse).
func (u *Usage) Check(cat contract.Category, caps []contract.FrequencyCap, now time.Time, own ...string) *Over {
	others := slices.DeleteFunc(slices.Clone(u.sends), func(s contract.FrequencySend) bool { return slices.Contains(own, s.Job) })
	return firstOver(others, []contract.Category{cat}, caps, now)
}

// Holds reports whether job holds a reservation.
func (u *Usage) Holds(job string) bool {
	return slices.ContainsFunc(u.sends, func(s contract.FrequencySend) bool { return s.Job == job })
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
