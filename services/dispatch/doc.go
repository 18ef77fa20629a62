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
// Per job: a job that may have been handled before (redelivered, or marked
// Recheck when re-published or rendered by a resumed expansion) is checked
// against the idempotency ledger first, so one already sent is acknowledged
// without sending. For successes the ledger is the task's stored sent
// events (sentindex.go: each is stored before its job is acknowledged, so
// it costs nothing per send); KV broadcast_ledger (key <task>.<index>)
// keeps attempt errors, and a sent record only when the event could not be
// stored. Fresh jobs skip the lookups. The channel adapter is called with
// the job id as Idempotency-Key; the answer is classified
// (shared.ErrorClass).
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
// per-job steps, failure handling, rerouting), pacer.go (adaptive token
// bucket), caps.go (daily cap, per-recipient gap), delay.go (scheduled
// waits, moving jobs), control.go (pause/cancel of tasks), backoff.go
// (retry delays), ledger.go (attempt history), sentindex.go (idempotency),
// deadletter.go (giving up), config.go (settings).
package dispatch
