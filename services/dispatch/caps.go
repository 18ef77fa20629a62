package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// capWindow is daily_cap's rolling window.
const capWindow = 24 * time.Hour

// capTracker enforces a daily cap (distinct recipients per rolling 24 h)
// and per_recipient_interval for one account, or the shared daily count of
// a portfolio's accounts. Its memory is a live view of its keys in KV
// broadcast_sends, so every dispatch replica sees the sends of the others
// and a new owner starts with the true count.
type capTracker struct {
	kv     jetstream.KeyValue
	prefix string // the keys' first token: the account, or portfolioKey
	log    *slog.Logger

	mu       sync.Mutex
	last     map[string]time.Time // recipient hash -> last send
	inFlight map[string]int       // recipient hash -> sends under way
}

// portfolioKey is the first token of a portfolio's keys in
// broadcast_sends; "=" is in no account name, so it cannot clash.
func portfolioKey(portfolio string) string { return "pf=" + portfolio }

func newCapTracker(ctx context.Context, kv jetstream.KeyValue, prefix string, log *slog.Logger) (*capTracker, error) {
	c := &capTracker{kv: kv, prefix: prefix, log: log, last: map[string]time.Time{}, inFlight: map[string]int{}}
	w, err := kv.Watch(ctx, prefix+".*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("watch sends of %s: %w", prefix, err)
	}
	if err := shared.FollowWatch(ctx, w, log, func(e jetstream.KeyValueEntry, _ bool) { c.record(e) }); err != nil {
		return nil, err
	}
	return c, nil
}

// record notes a send from the log: the key is <prefix>.<recipient hash>,
// the value the send's time in Unix nanoseconds.
func (c *capTracker) record(e jetstream.KeyValueEntry) {
	_, h, _ := strings.Cut(e.Key(), ".")
	at := e.Created()
	if ns, err := strconv.ParseInt(string(e.Value()), 10, 64); err == nil {
		at = time.Unix(0, ns)
	}
	c.mu.Lock()
	if at.After(c.last[h]) {
		c.last[h] = at
	}
	c.mu.Unlock()
}

func recipientHash(to string) string {
	sum := sha256.Sum256([]byte(to))
	return hex.EncodeToString(sum[:12])
}

// admission is what admit decided.
type admission struct {
	ok     bool
	wait   time.Duration
	code   string // "daily_cap" or "per_recipient_interval"
	reason string
}

// admit reserves a send to `to` now, or says how long to wait and why;
// capName says which cap dailyCap is, for the reason ("daily_cap 30
// reached on account a").
func (c *capTracker) admit(to string, now time.Time, dailyCap int, capName string, interval time.Duration) admission {
	h := recipientHash(to)
	c.mu.Lock()
	defer c.mu.Unlock()
	last, seen := c.last[h]
	if seen && now.Sub(last) >= capWindow {
		delete(c.last, h)
		seen = false
	}
	if c.inFlight[h] > 0 {
		return admission{wait: max(interval, time.Second), code: "per_recipient_interval", reason: "another send to this recipient is under way"}
	}
	if interval > 0 && seen && now.Sub(last) < interval {
		return admission{wait: interval - now.Sub(last), code: "per_recipient_interval",
			reason: fmt.Sprintf("per_recipient_interval %s: last send to this recipient %s ago", interval, now.Sub(last).Round(time.Millisecond))}
	}
	if adm, full := c.fullLocked(now, dailyCap, capName, seen); full {
		return adm
	}
	c.inFlight[h]++
	return admission{ok: true}
}

// admitShared reserves a slot of a cap several accounts share (a
// portfolio's): a recipient already counted takes no new slot, and sends
// to one recipient through several accounts may run at once.
func (c *capTracker) admitShared(to string, now time.Time, dailyCap int, capName string) admission {
	h := recipientHash(to)
	c.mu.Lock()
	defer c.mu.Unlock()
	last, seen := c.last[h]
	seen = seen && now.Sub(last) < capWindow || c.inFlight[h] > 0
	if adm, full := c.fullLocked(now, dailyCap, capName, seen); full {
		return adm
	}
	c.inFlight[h]++
	return admission{ok: true}
}

// fullLocked reports whether a recipient not yet counted (seen false)
// finds the cap full, with the admission saying how long to wait.
func (c *capTracker) fullLocked(now time.Time, dailyCap int, capName string, seen bool) (admission, bool) {
	if dailyCap <= 0 || seen {
		return admission{}, false
	}
	used, oldest := c.usedLocked(now)
	if used < dailyCap {
		return admission{}, false
	}
	wait := time.Minute
	if !oldest.IsZero() {
		wait = max(oldest.Add(capWindow).Sub(now), time.Second)
	}
	return admission{wait: wait, code: "daily_cap",
		reason: fmt.Sprintf("%s; next slot in %s", capName, wait.Round(time.Second))}, true
}

// usedLocked counts distinct recipients in the window (plus sends under
// way) and finds the oldest entry. It prunes expired entries as it goes.
func (c *capTracker) usedLocked(now time.Time) (int, time.Time) {
	var oldest time.Time
	for h, t := range c.last {
		if now.Sub(t) >= capWindow {
			delete(c.last, h)
			continue
		}
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	n := len(c.last)
	for h := range c.inFlight {
		if _, ok := c.last[h]; !ok {
			n++
		}
	}
	return n, oldest
}

// used returns the distinct recipients in the window.
func (c *capTracker) used(now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, _ := c.usedLocked(now)
	return n
}

// release ends a reservation; a send that reached the provider is recorded
// in memory and in KV, where the other replicas see it.
func (c *capTracker) release(ctx context.Context, to string, sent bool, now time.Time) {
	h := recipientHash(to)
	c.mu.Lock()
	if c.inFlight[h]--; c.inFlight[h] <= 0 {
		delete(c.inFlight, h)
	}
	if sent {
		c.last[h] = now
	}
	c.mu.Unlock()
	if !sent {
		return
	}
	if _, err := c.kv.Put(ctx, c.prefix+"."+h, []byte(strconv.FormatInt(now.UnixNano(), 10))); err != nil {
		c.log.Warn("could not record send for caps", "key", c.prefix, "err", err)
	}
}
