// Package dispatch holds the end-to-end tests of how dispatch sends:
// pacing, adaptive rates, pools, caps, provider signals, failover and
// accounts shared between replicas, priorities. Each runs the four services in one process
// (internal/pipelinetest) against an embedded nats-server and provider
// stand-ins (e2e/harness), often with dispatch replicas of its own
// (harness.DispatchEnv). They were part of package e2e; they are a test
// binary of their own so that each package of go test ./... stays well
// inside its ten-minute default timeout. Test names start with
// TestDispatch (and TestDeletedAccountIsReaped). Digests and the recipient
// policy, which dispatch applies across tasks, are tested in e2e/crosstask.
// See docs/testing.md.
//
// Helpers: dispatch_race_test.go / dispatch_norace_test.go say whether the
// race detector is on (its slowdown widens some bounds); the other helpers
// are in the file of the tests that use them (capWaits and
// distinctAccepted, which dispatch_capwake_test.go and
// dispatch_signals_test.go use too, in dispatch_caps_test.go).
//
// Tests:
//   - dispatch_pacing_test.go: pacing, one and three replicas (run
//     serially: they measure time).
//   - dispatch_adaptive_test.go and dispatch_adaptive_law_test.go: adaptive
//     rates against a throttling gateway, the control law's ceiling.
//   - dispatch_pool_test.go: pools: failover on 401, a disabled or deleted
//     account, no healthy account, a pool of many accounts.
//   - dispatch_caps_test.go and dispatch_capwake_test.go: daily caps,
//     per-recipient intervals, the wait reason, waking on an edit and
//     moving to an account with capacity.
//   - dispatch_signals_test.go: provider signals: quality ratings,
//     portfolio and messaging limits, warm-up.
//   - dispatch_failover_test.go: failover between replicas, the lease
//     through a long Retry-After.
//   - dispatch_share_test.go: accounts shared between replicas.
//   - dispatch_priority_test.go: priorities (run serially).
//   - dispatch_ledger_test.go: the send ledger, dead-letter history.
//   - dispatch_longwait_test.go: long waits hold no slot.
package dispatch
