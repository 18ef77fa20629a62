package gateway

import "time"

// bucket is a token bucket on the gateway's own clock. It is not safe for
// concurrent use; the gateway's mutex guards it.
type bucket struct {
	tokens  float64
	last    time.Duration
	started bool
}

// take removes one token at now if there is one. Otherwise it reports how
// long until the next token, which is what a refused client should wait.
// A bucket starts full.
func (b *bucket) take(now time.Duration, rate float64, burst int) (ok bool, wait time.Duration) {
	if !b.started {
		b.started, b.tokens, b.last = true, float64(burst), now
	}
	if now > b.last {
		b.tokens = min(float64(burst), b.tokens+(now-b.last).Seconds()*rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / rate * float64(time.Second))
}
