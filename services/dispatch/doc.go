// Package dispatch sends jobs through sender accounts, paced so accounts are
// not throttled or banned, and never loses or repeats a message.
//
// Consumes: stream JOBS, one durable pull consumer per account
// ("dispatch-<account>", filter broadcast.jobs.<account>.>), created and
// resized live as KV broadcast_accounts changes. The consumer's MaxAckPending
// is the account's concurrency (the in-flight cap; for batch accounts see
// below) and the client buffer is no larger; a token bucket (golang.org/x/time/rate) paces sends at
// rate_per_sec with burst.
//
// Per job: the idempotency ledger (KV broadcast_ledger, key <task>.<index>)
// is checked first, so a redelivered job that was already sent is
// acknowledged without sending; the channel adapter is called with the job
// id as Idempotency-Key; the answer is classified (shared.ErrorClass).
//
// Batch accounts (max_batch > 1, e.g. WxPusher's 2,000 uids per call): jobs
// stay one per recipient in JOBS, and each still goes through every per-job
// step, but instead of calling the adapter itself a job joins the account's
// batcher (batcher.go), which makes one call per group of jobs with
// identical text: when the group is full, when no job joined it for
// batchLinger (150 ms, not counting time in which earlier calls' jobs are
// still settling), or after batchMaxWait (2 s). For these accounts
// rate_per_sec and concurrency count provider calls (one token per call,
// at most concurrency calls in flight), and the consumer holds
// concurrency×max_batch×4 jobs (at most 10,000) so groups can fill. Every
// job gets its own result and outcome, so a partly failed call retries only
// its failed recipients, which merge again with whatever waits. A pause,
// cancel or drain is checked again before each call and every linger for
// waiting jobs. A rate-limited call slows the account once. max_batch 1
// accounts call the adapter from the job's handler, with no extra hop.
//
// Safety: each account's consumer is pinned to one dispatch process at a
// time (priority group, PriorityPolicyPinned), so that process's token
// bucket is the account's rate across replicas; a stopping owner releases
// the pin at once, a crashed one loses it after PinnedTTL. Pacing is
// adaptive (pacer.go: a 429 halves the rate and honours Retry-After; runs of
// successes step it back up). daily_cap and per_recipient_interval are
// enforced over KV broadcast_sends (caps.go). Account-fatal answers or three
// auth failures in a row pause the account (KV broadcast_health); its jobs
// move to healthy accounts of the task's pool (reroute in send.go).
//
// Publishes: broadcast.events.<task>.<kind> for every outcome (sent,
// retrying, failed, expired, cancelled), and broadcast.dead.<task> for every
// recipient given up on, with every attempt's error (before its failed
// event). Short retries use NakWithDelay with exponential backoff and
// jitter; waits of Config.LongWait or more (long backoff, Retry-After,
// caps, no healthy account) are JetStream scheduled messages on
// broadcast.delay.<account>.<job> (delay.go), which hold no MaxAckPending
// slot. Jobs of paused or unapproved tasks are parked (control.go).
//
// Where to edit what: dispatch.go (service, account lifecycle),
// account.go (one account's consumer, pin, health and sender), send.go (the
// per-job steps, failure handling, rerouting), batcher.go (merging sends of
// batch accounts into calls), pacer.go (adaptive token
// bucket), caps.go (daily cap, per-recipient gap), delay.go (scheduled
// waits, moving jobs), control.go (pause/cancel of tasks), backoff.go
// (retry delays), ledger.go (idempotency and attempt history),
// deadletter.go (giving up), config.go (settings).
package dispatch
