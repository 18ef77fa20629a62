package suppress

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// hash is a recipient's SHA-256: the view keeps it, not the recipient.
type hash [32]byte

// mark is what the view keeps of an entry: 16 bytes.
type mark struct {
	until  int64 // Unix seconds when it stops suppressing; 0 never
	reason uint8 // index into View.reasons
	cats   uint8 // categoryBit of each category; 0 every category
}

// marks are the entries of one scope.
type marks map[hash]mark

// View is a live copy of the suppression list holding, per scope, only
// each entry's recipient hash, reason, categories and Until. Memory is
// about 120 bytes per entry (BenchmarkViewMemory: 1M entries ≈ 118 MB,
// map overhead included), bounded by the bucket's entries. A Lookup is
// one SHA-256 and at most two map reads under a read lock, under 1 µs
// with 1M entries (BenchmarkLookup).
type View struct {
	mu      sync.RWMutex
	scopes  map[string]marks
	reasons []string       // interned reasons; index 255 means "other"
	reason  map[string]int // reason -> index into reasons
	now     func() time.Time
}

// NewView is an empty view; Watch fills one from the bucket.
func NewView() *View {
	return &View{scopes: map[string]marks{}, reason: map[string]int{}, now: time.Now}
}

// Watch follows KV broadcast_suppressions and returns once its current
// entries are loaded. The entries are read as a snapshot through a pull
// consumer, in batches the view asks for, so a list of millions loads at
// the pace of the reader and never overruns the connection; changes after
// the snapshot then come from a watch resumed at the next revision. After
// a reconnect both start over and the new snapshot replaces the old view,
// so an entry removed meanwhile is dropped. Entries that do not decode are
// logged by key (never by recipient) and ignored.
func Watch(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*View, error) {
	kv, err := js.KeyValue(ctx, contract.BucketSuppressions)
	if err != nil {
		return nil, fmt.Errorf("%s bucket: %w", contract.BucketSuppressions, err)
	}
	v := NewView()
	// Listening before the snapshot: a reconnect at any point after it
	// makes follow load again.
	reconnected := js.Conn().StatusChanged(nats.CONNECTED)
	scopes, last, err := v.snapshot(ctx, js, log)
	var w jetstream.KeyWatcher
	if err == nil {
		w, err = kv.WatchAll(ctx, jetstream.ResumeFromRevision(last+1))
	}
	if err != nil {
		js.Conn().RemoveStatusListener(reconnected)
		return nil, fmt.Errorf("load %s: %w", contract.BucketSuppressions, err)
	}
	v.scopes = scopes
	go v.follow(ctx, kv, js, w, reconnected, log)
	return v, nil
}

// snapshotBatch is how many entries one pull of the snapshot asks for.
const snapshotBatch = 4096

// snapshot reads the bucket's current entries into new scopes and returns
// them with the stream's last sequence they cover: the watch that follows
// starts after it.
func (v *View) snapshot(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (map[string]marks, uint64, error) {
	stream := "KV_" + contract.BucketSuppressions
	scopes := map[string]marks{}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, 0, err
	}
	if st.CachedInfo().State.Msgs == 0 {
		return scopes, st.CachedInfo().State.LastSeq, nil
	}
	// An ephemeral consumer without acks, deleted when done (or by the
	// server once idle, if this process dies first).
	c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubject: "$KV." + contract.BucketSuppressions + ".>", AckPolicy: jetstream.AckNonePolicy,
		MaxRequestBatch: snapshotBatch, InactiveThreshold: time.Minute, MemoryStorage: true,
	})
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = st.DeleteConsumer(dctx, c.CachedInfo().Name)
		cancel()
	}()
	prefix := "$KV." + contract.BucketSuppressions + "."
	// Each pull asks for no more than remain, so it is answered as soon as
	// the messages are there, not when its wait runs out.
	last, remain := st.CachedInfo().State.LastSeq, c.CachedInfo().NumPending
	for remain > 0 {
		batch, err := c.Fetch(int(min(remain, snapshotBatch)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, 0, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, err
			}
			last, remain = max(last, md.Sequence.Stream), md.NumPending
			// A delete or purge marker (KV-Operation), or a server's
			// marker for a removed message, takes the key out.
			put := m.Headers().Get("KV-Operation") == "" && m.Headers().Get(jetstream.MarkerReasonHeader) == ""
			v.mu.Lock()
			err = v.apply(scopes, strings.TrimPrefix(m.Subject(), prefix), put, m.Data())
			v.mu.Unlock()
			if err != nil {
				log.Warn("bad suppression entry ignored", "key", m.Subject(), "err", err)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, 0, err
		}
		if got == 0 {
			return nil, 0, fmt.Errorf("no entry within 5s, %d still to read", remain)
		}
	}
	return scopes, last, nil
}

// follow applies the watch's changes until ctx ends; on a reconnect it
// loads a fresh snapshot, swaps it in, and watches on from there.
func (v *View) follow(ctx context.Context, kv jetstream.KeyValue, js jetstream.JetStream, w jetstream.KeyWatcher, reconnected chan nats.Status, log *slog.Logger) {
	defer js.Conn().RemoveStatusListener(reconnected)
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reconnected:
			_ = w.Stop()
			for {
				scopes, last, err := v.snapshot(ctx, js, log)
				var nw jetstream.KeyWatcher
				if err == nil {
					nw, err = kv.WatchAll(ctx, jetstream.ResumeFromRevision(last+1))
				}
				if err == nil {
					v.mu.Lock()
					v.scopes = scopes
					v.mu.Unlock()
					w = nw
					break
				}
				log.Warn("cannot load the suppression list again after a reconnect; retrying", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(250 * time.Millisecond):
				}
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // the end of the changes made before the watch
				continue
			}
			func() {
				defer shared.Recover(log, "applying suppression key "+e.Key(), nil)
				v.mu.Lock()
				defer v.mu.Unlock()
				if err := v.apply(v.scopes, e.Key(), e.Operation() == jetstream.KeyValuePut, e.Value()); err != nil {
					log.Warn("bad suppression entry ignored", "key", e.Key(), "err", err)
				}
			}()
		}
	}
}

// Apply records one entry (put) or its removal; it is what the watch does
// with each change, exposed for tests and benchmarks.
func (v *View) Apply(key string, put bool, value []byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.apply(v.scopes, key, put, value)
}

// apply changes scopes; v.mu is held.
func (v *View) apply(scopes map[string]marks, key string, put bool, value []byte) error {
	scope, hexHash, ok := strings.Cut(key, ".")
	var h hash
	if !ok || !contract.ValidScope(scope) || len(hexHash) != 64 {
		return fmt.Errorf("key: want <scope>.<64 hex digits>")
	}
	if _, err := hex.Decode(h[:], []byte(hexHash)); err != nil {
		return fmt.Errorf("key: want <scope>.<64 hex digits>")
	}
	m := scopes[scope]
	if !put {
		delete(m, h)
		return nil
	}
	var e entryFields
	if err := decodeEntry(value, &e); err != nil {
		delete(m, h)
		return fmt.Errorf("value: %v", err)
	}
	mk := mark{reason: v.intern(e.Reason)}
	if e.Until != nil {
		mk.until = max(e.Until.Unix(), 1)
	}
	for _, c := range e.Categories {
		mk.cats |= categoryBit(c)
	}
	if len(e.Categories) > 0 && mk.cats == 0 {
		// Only unknown categories: it suppresses none of ours.
		delete(m, h)
		return fmt.Errorf("categories: none of marketing, utility, transactional")
	}
	if m == nil {
		m = marks{}
		scopes[scope] = m
	}
	m[h] = mk
	return nil
}

// entryFields are the parts of a contract.Suppression the view keeps:
// decoding only these (the recipient, source and time are skipped) halves
// the cost of loading a large list.
type entryFields struct {
	Reason     string              `json:"reason"`
	Categories []contract.Category `json:"categories"`
	Until      *time.Time          `json:"until"`
}

// decodeEntry decodes with go-json, falling back to encoding/json (for
// its error) whenever go-json fails or panics, as contract's codec does.
func decodeEntry(data []byte, e *entryFields) (err error) {
	if func() (ok bool) {
		defer func() {
			if recover() != nil {
				ok = false
			}
		}()
		return gojson.Unmarshal(data, e) == nil
	}() {
		return nil
	}
	*e = entryFields{}
	return json.Unmarshal(data, e)
}

// maxReasons bounds the interned reasons; others read as "other".
const maxReasons = 255

func (v *View) intern(reason string) uint8 {
	if i, ok := v.reason[reason]; ok {
		return uint8(i)
	}
	if len(v.reasons) >= maxReasons {
		return maxReasons
	}
	v.reasons = append(v.reasons, reason)
	v.reason[reason] = len(v.reasons) - 1
	return uint8(len(v.reasons) - 1)
}

func categoryBit(c contract.Category) uint8 {
	switch c {
	case contract.CategoryMarketing:
		return 1
	case contract.CategoryUtility:
		return 2
	case contract.CategoryTransactional:
		return 4
	}
	return 0
}

// Hit is the entry that suppresses a recipient.
type Hit struct {
	// Scope is the channel name or "all".
	Scope string
	// Reason is the entry's reason.
	Reason string
}

// Explain is the skipped event's error for the hit; it names the scope
// and reason, not the recipient.
func (h Hit) Explain() string {
	return "on the suppression list (scope " + h.Scope + ", reason " + h.Reason + ")"
}

// Lookup reports whether to, already normalized by channel (as render
// and dispatch have it), is suppressed for a message of category c: an
// entry in the channel's scope or in "all" whose categories include c and
// whose Until has not passed. A nil view suppresses nothing.
func (v *View) Lookup(channel, to string, c contract.Category) (Hit, bool) {
	if v == nil {
		return Hit{}, false
	}
	bit := categoryBit(c)
	if bit == 0 {
		bit = categoryBit(contract.CategoryMarketing)
	}
	now := v.now().Unix()
	v.mu.RLock()
	defer v.mu.RUnlock()
	if len(v.scopes) == 0 {
		return Hit{}, false
	}
	chm, allm := v.scopes[channel], v.scopes[contract.ScopeAll]
	if len(chm) == 0 && len(allm) == 0 {
		return Hit{}, false
	}
	form := keyForm(channel, to)
	h := hash(sha256Sum(form))
	if mk, ok := chm[h]; ok && mk.covers(bit, now) {
		return Hit{Scope: channel, Reason: v.reasonOf(mk)}, true
	}
	if len(allm) > 0 {
		// An SMTP recipient's key form is its "all" form already; others
		// may differ (a webhook recipient with an email address in it).
		if channel != smtpChannel {
			if n := normalizeAll(to); n != form {
				h = hash(sha256Sum(n))
			}
		}
		if mk, ok := allm[h]; ok && mk.covers(bit, now) {
			return Hit{Scope: contract.ScopeAll, Reason: v.reasonOf(mk)}, true
		}
	}
	return Hit{}, false
}

func (m mark) covers(bit uint8, now int64) bool {
	return (m.until == 0 || now < m.until) && (m.cats == 0 || m.cats&bit != 0)
}

func (v *View) reasonOf(m mark) string {
	if int(m.reason) < len(v.reasons) {
		return v.reasons[m.reason]
	}
	return "other"
}

// Len is the number of entries held, over all scopes.
func (v *View) Len() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n := 0
	for _, m := range v.scopes {
		n += len(m)
	}
	return n
}
