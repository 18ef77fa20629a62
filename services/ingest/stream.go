package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// Recipient lists in the object store are expanded in two streaming passes,
// so a million-line list never sits in memory: the first pass counts
// distinct recipients and remembers, per address hash, the line of its first
// occurrence; the second publishes exactly those lines in render batches.
// Memory is one sorted 20-byte entry per line (no map overhead): about
// 20 MB for a million recipients.

// addrKey identifies a normalised address (128-bit FNV: collisions are not
// a practical concern at any list size).
type addrKey [16]byte

func keyOf(addr string) addrKey {
	h := fnv.New128a()
	h.Write([]byte(addr))
	var k addrKey
	h.Sum(k[:0])
	return k
}

// firstSeen pairs an address with the line it first appears on.
type firstSeen struct {
	key  addrKey
	line int32
}

// listIndex is what the first pass learned: the first occurrence of every
// address, sorted by address for binary search.
type listIndex struct {
	first      []firstSeen
	total      int
	duplicates int
	// digest is the object's, to pin in the task record.
	digest string
}

// isFirst reports whether line is the first occurrence of key.
func (idx *listIndex) isFirst(key addrKey, line int) bool {
	i, found := slices.BinarySearchFunc(idx.first, key, func(e firstSeen, k addrKey) int { return bytes.Compare(e.key[:], k[:]) })
	return found && idx.first[i].line == int32(line)
}

// seal sorts the entries (by address, then line) and keeps the first line of
// each address, counting the others as duplicates.
func (idx *listIndex) seal() {
	slices.SortFunc(idx.first, func(a, b firstSeen) int {
		if c := bytes.Compare(a.key[:], b.key[:]); c != 0 {
			return c
		}
		return int(a.line - b.line)
	})
	before := len(idx.first)
	idx.first = slices.CompactFunc(idx.first, func(a, b firstSeen) bool { return a.key == b.key })
	idx.duplicates = before - len(idx.first)
	idx.total -= idx.duplicates
	idx.first = slices.Clip(idx.first)
}

// normalized returns the entry as a render batch recipient and its dedup key
// ("" for unusable lines, which are never duplicates of anything).
func normalized(ch channels.Channel, e listEntry) (contract.BatchRecipient, string) {
	if e.Invalid != "" {
		return contract.BatchRecipient{To: e.Recipient.To, Invalid: e.Invalid}, ""
	}
	br := contract.BatchRecipient{To: e.Recipient.To, Vars: e.Recipient.Vars}
	if err := e.Recipient.Validate(); err != nil {
		br.Invalid = fmt.Sprintf("line %d: %v", e.Line, err)
		return br, e.Recipient.To
	}
	to, err := ch.NormalizeRecipient(e.Recipient.To)
	if err != nil {
		br.Invalid = fmt.Sprintf("line %d: to: %v", e.Line, err)
		return br, e.Recipient.To
	}
	br.To = to
	if why := contract.CheckVars(br.Vars); why != "" {
		br.Invalid, br.Vars = fmt.Sprintf("line %d: %s", e.Line, why), nil
	}
	return br, to
}

// listChangedError says a task's list is no longer the object it was
// accepted with.
type listChangedError struct{ name, was, now string }

func (e *listChangedError) Error() string {
	return fmt.Sprintf("recipients_object: %s was replaced after the task was accepted (digest %s, now %s); submit a new task to send the new list", e.name, e.was, e.now)
}

// openList streams the named object. With pin set, an object whose digest
// differs is not read: it returns a *listChangedError.
func (s *Service) openList(ctx context.Context, name, pin string, fn func(listEntry) error) (digest string, err error) {
	// Without a deadline of its own, an object read gets the client's
	// default timeout (5 s) for the whole object: a 1M-line list read while
	// batches are published took longer, failed with "nats: timeout" and
	// started over from the checkpoint, again and again.
	ctx, cancel := context.WithTimeout(ctx, listReadTimeout)
	defer cancel()
	obj, err := s.objects.Get(ctx, name)
	if err != nil {
		return "", err
	}
	defer obj.Close()
	info, err := obj.Info()
	if err != nil {
		return "", err
	}
	if pin != "" && info.Digest != pin {
		return info.Digest, &listChangedError{name: name, was: pin, now: info.Digest}
	}
	return info.Digest, readList(obj, name, fn)
}

// indexList is the first pass. A missing object or a malformed list is a
// *contract.FieldError on recipients_object.
func (s *Service) indexList(ctx context.Context, ch channels.Channel, name, pin string) (*listIndex, error) {
	idx := &listIndex{}
	var err error
	idx.digest, err = s.openList(ctx, name, pin, func(e listEntry) error {
		if _, key := normalized(ch, e); key != "" {
			idx.first = append(idx.first, firstSeen{key: keyOf(key), line: int32(e.Line)})
		}
		idx.total++
		return nil
	})
	var le *listError
	var lc *listChangedError
	switch {
	case errors.As(err, &lc):
		return nil, err
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, &contract.FieldError{Field: "recipients_object", Reason: fmt.Sprintf("no object %q in %s", name, contract.BucketRecipients)}
	case errors.As(err, &le):
		return nil, &contract.FieldError{Field: "recipients_object", Reason: fmt.Sprintf("%s: %s", name, le.reason)}
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	idx.seal()
	return idx, nil
}

// listReadTimeout bounds one pass over a recipient list.
const listReadTimeout = 2 * time.Hour

// checkpointRecipients is about how many recipients a streamed expansion
// publishes between checkpoints (64 batches of the default 500): the
// batches of a flush are held in memory until it.
const checkpointRecipients = 32_000

// publishList is the second pass: it publishes the distinct recipients from
// rec.Checkpoint on, in batches aligned with a fresh run's, so a resumed
// expansion publishes nothing twice.
func (s *Service) publishList(ctx context.Context, ch channels.Channel, rec *contract.TaskRecord, idx *listIndex, resumed bool) error {
	name := rec.Task.RecipientsObject
	// After a crash only the batches of the flush it interrupted, at most
	// batchesPerFlush past the checkpoint, can have been published: only
	// they are marked Resumed (their jobs cost dispatch a ledger lookup).
	size := s.batchSize(rec)
	batchesPerFlush := max(1, checkpointRecipients/size)
	resumedUntil := 0
	if resumed {
		resumedUntil = rec.Checkpoint + batchesPerFlush*size
	}
	var (
		index   int
		batch   []contract.BatchRecipient
		bytes   int
		pending []contract.RenderBatch
	)
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if err := s.publishBatches(ctx, pending, false); err != nil {
			return err
		}
		last := pending[len(pending)-1]
		rec.Checkpoint = last.First + len(last.Recipients)
		pending = pending[:0]
		return s.putRecord(ctx, rec)
	}
	_, err := s.openList(ctx, name, rec.ListDigest, func(e listEntry) error {
		br, key := normalized(ch, e)
		if key != "" && !idx.isFirst(keyOf(key), e.Line) {
			return nil // a later occurrence of an address
		}
		index++
		if index <= rec.Checkpoint {
			return nil // published before a restart
		}
		if n := br.BatchBytes(); len(batch) > 0 && bytes+n > s.batchBytes {
			// Cut by size too: the batch must fit the server's max_payload.
			// The cut depends only on the list, so a resumed run cuts alike.
			first := index - 1 - len(batch)
			pending = append(pending, contract.RenderBatch{TaskID: rec.Task.ID, First: first, Recipients: batch, Resumed: first < resumedUntil})
			batch, bytes = nil, 0
		}
		batch = append(batch, br)
		bytes += br.BatchBytes()
		if len(batch) == size {
			first := index - len(batch)
			pending = append(pending, contract.RenderBatch{TaskID: rec.Task.ID, First: first, Recipients: batch, Resumed: first < resumedUntil})
			batch, bytes = nil, 0
			if len(pending) == batchesPerFlush {
				return flush()
			}
		}
		return nil
	})
	var lc *listChangedError
	if errors.As(err, &lc) {
		return err
	}
	if err != nil {
		return fmt.Errorf("expand %s: %w", name, err)
	}
	if len(batch) > 0 {
		first := index - len(batch)
		pending = append(pending, contract.RenderBatch{TaskID: rec.Task.ID, First: first, Recipients: batch, Resumed: first < resumedUntil})
	}
	if err := flush(); err != nil {
		return err
	}
	if index != idx.total {
		return fmt.Errorf("expand %s: list changed between passes (%d recipients, then %d)", name, idx.total, index)
	}
	return nil
}
