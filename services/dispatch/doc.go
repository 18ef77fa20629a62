// Package dispatch sends jobs through sender accounts, paced so accounts are
// not throttled or banned, and never loses or repeats a message.
//
// Consumes: stream JOBS, one durable pull consumer per account
// ("dispatch-<account>", filter broadcast.jobs.<account>.>), created and
// resized live as KV broadcast_accounts changes. The consumer's MaxAckPending
// is the account's concurrency (the in-flight cap) and the client buffer is
// no larger; a token bucket (golang.org/x/time/rate) paces sends at
// rate_per_sec with burst.
//
// Per job: the idempotency ledger (KV broadcast_ledger, key <task>.<index>)
// is checked first, so a redelivered job that was already sent is
// acknowledged without sending; the channel adapter is called with the job
// id as Idempotency-Key; the answer is classified (shared.ErrorClass).
//
// Publishes: broadcast.events.<task>.<kind> for every outcome (sent,
// retrying, failed, expired), and broadcast.dead.<task> for every recipient
// given up on (before its failed event). Retries use NakWithDelay with
// exponential backoff and jitter, or the provider's Retry-After.
//
// Where to edit what: dispatch.go (service, account lifecycle),
// account.go (one account's consumer, limiter and sender), send.go (the
// per-job steps), backoff.go (retry delays), ledger.go (idempotency),
// deadletter.go (giving up), config.go (settings).
package dispatch
