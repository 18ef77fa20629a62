// Package gateway is a real HTTP server that plays a provider for
// Broadcast's webhook channel. Integration tests, the demo, benchmarks and
// the smoke script point webhook accounts at it, inject faults through its
// Config and then check its Ledger: what arrived, what was accepted, how many
// deliveries were duplicates and how fast each account was really sent.
//
// It speaks the webhook protocol of the contract (DESIGN.md, "Webhook
// channel"): POST /send (or any path ending in /send, or /) with the JSON
// body {"id","task_id","to","body","account","attempt"}, Idempotency-Key equal
// to the body id, and X-Broadcast-Signature when a secret is configured. It
// answers 200 {"id":"<provider message id>"} when sent, 429 with Retry-After
// when rate limited, 503 or 504 (after hanging) for retryable faults, 400 for
// permanent ones and 401 for bad credentials. A key accepted twice is still
// answered 200, as an idempotency-friendly provider would, and counted as a
// duplicate.
//
// A send request is decided in this order: body read, Latency, signature
// (401), shape (400), a Tape's recorded answer (which skips the rest), a
// storm (429 to everything while Storm's window lasts, counted as
// Injected["429"]), the account's token bucket (429, Refused), Unauthorized
// (401), FatalPrefix (401), PermanentPrefix (400), then one draw against
// FailRate, RateLimitedRate and TimeoutRate. Every 429 carries Retry-After,
// except the drawn ones when OmitInjectedRetryAfter is set and all of them
// when NoRetryAfter is. With a non-zero Seed the draw is a hash of
// (Seed, Idempotency-Key, attempt), so a run is reproducible whatever the
// order in which requests arrive.
//
// Use New for an http.Handler (with httptest.NewServer in tests), Serve to
// listen on an address until a context ends, and FetchLedger / ResetLedger to
// reach a gateway running in another process (POST /storm?for=5s starts a
// storm there).
//
// Where to edit what:
//   - config.go: Config, its defaults and validation.
//   - gateway.go: routes, the send decision, storms, fault draws and answers.
//   - bucket.go: the per-account token bucket.
//   - ledger.go: the Ledger snapshot and the bookkeeping behind it.
//   - serve.go: Serve, graceful shutdown and the HTTP client helpers.
//   - tape.go: Tape, recorded answers played back per key and attempt.
//
// The gateway keeps every key it has seen in memory until Reset; it is a test
// instrument, not a long-running service.
package gateway
