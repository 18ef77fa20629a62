package status

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// Each account's health score (contract.HealthScore) comes from its
// outcomes over the last hour, counted here as events are folded: sent
// recipients, receipts (delivered, undelivered, blocks) and attempts
// refused as too fast. The folding process keeps one bucket a minute per
// account and writes each changed account's window to KV broadcast_scores
// every scoreInterval, so every status process (and `nats kv get`) shows
// the same value; the metric broadcast_account_health_score follows it. A
// process that takes over the fold starts from the written windows.

const (
	scoreWindow   = time.Hour
	scoreMinutes  = int(scoreWindow / time.Minute)
	scoreInterval = 5 * time.Second
)

// blockCodes are the receipt codes that say a recipient blocked, reported
// or opted out of the sender.
var blockCodes = map[string]bool{"131050": true, "131026": true, "complaint": true}

// scoreCounts are one account's counts in one minute.
type scoreCounts struct {
	minute                                                       int64 // Unix minute
	sent, delivered, undelivered, blocked, rateLimited, attempts int
}

// accountScores are one account's minutes, a ring indexed by Unix minute.
type accountScores struct {
	ring [scoreMinutes]scoreCounts
}

// at returns the bucket of minute m, cleared when it held an older minute.
func (a *accountScores) at(m int64) *scoreCounts {
	b := &a.ring[m%int64(scoreMinutes)]
	if b.minute != m {
		*b = scoreCounts{minute: m}
	}
	return b
}

// sum adds the minutes of the window ending at now.
func (a *accountScores) sum(now time.Time) scoreCounts {
	var t scoreCounts
	cur := now.Unix() / 60
	for i := range a.ring {
		b := &a.ring[i]
		if b.minute > cur-int64(scoreMinutes) && b.minute <= cur {
			t.sent += b.sent
			t.delivered += b.delivered
			t.undelivered += b.undelivered
			t.blocked += b.blocked
			t.rateLimited += b.rateLimited
			t.attempts += b.attempts
		}
	}
	return t
}

// scoreBook keeps the accounts' minutes.
type scoreBook struct {
	mu       sync.Mutex
	accounts map[string]*accountScores
	dirty    map[string]bool
}

func newScoreBook() *scoreBook {
	return &scoreBook{accounts: map[string]*accountScores{}, dirty: map[string]bool{}}
}

// note counts a folded event. counted says the fold changed something
// with it (a duplicate changes nothing, so it is not counted again); a
// rate-limited retry counts as an attempt either way, as repeated retries
// of one recipient leave its outcome unchanged.
func (b *scoreBook) note(ev *contract.Event, counted bool, now time.Time) {
	if ev.Account == "" {
		return
	}
	limited := ev.Kind == contract.EventRetrying && ev.Class == contract.ClassRateLimited
	if !counted && !limited {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.accounts[ev.Account]
	if a == nil {
		a = &accountScores{}
		b.accounts[ev.Account] = a
	}
	c := a.at(now.Unix() / 60)
	switch ev.Kind {
	case contract.EventSent:
		c.sent++
		c.attempts++
	case contract.EventFailed:
		c.attempts++
	case contract.EventRetrying:
		if !waitCode(ev.Code) {
			c.attempts++
		}
		if limited {
			c.rateLimited++
		}
	case contract.EventDelivered, contract.EventRead:
		c.delivered++
	case contract.EventUndelivered:
		c.undelivered++
	}
	if ev.Kind.ReceiptKind() && blockCodes[ev.Code] {
		c.blocked++
	}
	b.dirty[ev.Account] = true
}

// seed puts a written window back as one lump in the minute it was
// written, when that minute is still in the window.
func (b *scoreBook) seed(account string, s *contract.AccountScore, now time.Time) {
	if now.Sub(s.At) >= scoreWindow || s.At.After(now) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.accounts[account] != nil {
		return
	}
	a := &accountScores{}
	c := a.at(s.At.Unix() / 60)
	c.sent, c.delivered, c.undelivered, c.blocked, c.rateLimited, c.attempts =
		s.Sent, s.Delivered, s.Undelivered, s.Blocked, s.RateLimited, s.Attempts
	b.accounts[account] = a
}

// takeDirty returns the windows of the accounts changed since the last
// call, and of every account once a minute (old minutes leave the window).
func (b *scoreBook) takeDirty(now time.Time, all bool) map[string]scoreCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]scoreCounts{}
	for name, a := range b.accounts {
		if all || b.dirty[name] {
			out[name] = a.sum(now)
		}
	}
	b.dirty = map[string]bool{}
	return out
}

// scoreOf makes the written value of a window.
func scoreOf(c scoreCounts, quality string, now time.Time) contract.AccountScore {
	s := contract.AccountScore{Window: contract.Duration(scoreWindow), Sent: c.sent, Delivered: c.delivered,
		Undelivered: c.undelivered, Blocked: c.blocked, RateLimited: c.rateLimited, Attempts: c.attempts,
		Quality: quality, At: now.UTC()}
	s.Score = contract.HealthScore(s)
	return s
}

// writeScores writes the changed accounts' scores while this process
// folds (ctx ends when it stops folding).
func (s *Service) writeScores(ctx context.Context) {
	kv, err := s.js.KeyValue(ctx, contract.BucketScores)
	if err != nil {
		s.log.Warn("no scores bucket; account health scores are not written", "err", err)
		return
	}
	s.seedScores(ctx, kv)
	t := time.NewTicker(scoreInterval)
	defer t.Stop()
	lastAll := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			all := now.Sub(lastAll) >= time.Minute
			if all {
				lastAll = now
			}
			for name, c := range s.scores.takeDirty(now, all) {
				if !s.mayWriteShared() {
					return
				}
				v := scoreOf(c, s.signals.Get(name).QualityOrUnknown(), now)
				data, _ := json.Marshal(&v)
				if _, err := kv.Put(ctx, name, data); err != nil && ctx.Err() == nil {
					s.log.Warn("could not write an account's health score", "account", name, "err", err)
				}
			}
		}
	}
}

// seedScores starts the book from the windows the last folding process
// wrote.
func (s *Service) seedScores(ctx context.Context, kv jetstream.KeyValue) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for name := range lister.Keys() {
		e, err := kv.Get(ctx, name)
		if err != nil {
			continue
		}
		var v contract.AccountScore
		if json.Unmarshal(e.Value(), &v) == nil {
			s.scores.seed(name, &v, now)
		}
	}
}
