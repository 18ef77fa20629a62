package channels

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// MaxRetryAfter bounds what a provider may ask us to wait, so a garbage
// header cannot park a job for years.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads a Retry-After header: delta seconds or an HTTP date.
// It returns false when the header is absent or unusable.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || secs != secs {
			return 0, false
		}
		if secs > MaxRetryAfter.Seconds() {
			return MaxRetryAfter, true
		}
		return time.Duration(secs * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		if d > MaxRetryAfter {
			d = MaxRetryAfter
		}
		return d, true
	}
	return 0, false
}

// ClassifyHTTP maps an HTTP status to an error class per the webhook
// contract: 2xx sent (""), 429 rate limited, 408 and 5xx retryable, any other
// 4xx permanent. A 3xx is permanent too: adapters do not follow redirects
// (newHTTPClient), and retrying would get the same answer.
func ClassifyHTTP(status int) contract.ErrorClass {
	switch {
	case status >= 200 && status < 300:
		return ""
	case status >= 300 && status < 400:
		return contract.ClassPermanent
	case status == http.StatusTooManyRequests:
		return contract.ClassRateLimited
	case status == http.StatusRequestTimeout, status >= 500:
		return contract.ClassRetryable
	}
	return contract.ClassPermanent
}
