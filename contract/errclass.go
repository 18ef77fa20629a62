package contract

// ErrorClass says how a send outcome steers the queue. It is recorded on
// retrying and failed events.
type ErrorClass string

// Error classes.
const (
	// ClassRetryable: network error, timeout, 408, 5xx. Retried with backoff.
	ClassRetryable ErrorClass = "retryable"
	// ClassRateLimited: 429 or a provider throughput code. Retried after the
	// provider's Retry-After, and the account slows down.
	ClassRateLimited ErrorClass = "rate_limited"
	// ClassRecipientDelay: this recipient was messaged too recently
	// (WhatsApp 131056). Retried later without slowing the account.
	ClassRecipientDelay ErrorClass = "recipient_delay"
	// ClassPermanent: this recipient cannot be sent to. Not retried.
	ClassPermanent ErrorClass = "permanent"
	// ClassAccountFatal: the sender account cannot send (revoked token, spam
	// restriction). The account is paused; the job is retried elsewhere.
	ClassAccountFatal ErrorClass = "account_fatal"
)

// Retryable reports whether a job with this outcome may be attempted again.
func (c ErrorClass) Retryable() bool { return c != ClassPermanent }
