package dispatch

import (
	"math/rand/v2"
	"time"
)

// backoff is the delay before attempt+1 after attempt failed: exponential,
// capped, with jitter in [d/2, d] so a thousand failures do not come back in
// the same millisecond.
func backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}
