// Package dispatch holds the end-to-end tests of what dispatch decides:
// pacing, adaptive rates, pools, caps, failover, priorities, digests and
// the recipient policy. Each runs the four services in one process
// (internal/pipelinetest) against an embedded nats-server and provider
// stand-ins (e2e/harness), often with dispatch replicas of its own. They
// were part of package e2e; they are a test binary of their own so that
// each package of go test ./... stays well inside its ten-minute default
// timeout. Test names start with TestDispatch, TestDigest or TestPolicy
// (and TestDeletedAccountIsReaped). See docs/testing.md.
//
// Helpers, one file each:
//   - dispatch_helpers_test.go: dispatch replicas started and stopped one
//     by one (dispatchEnv), with a log of which replica sent what.
//   - dispatch_race_test.go / dispatch_norace_test.go: whether the race
//     detector is on (its slowdown widens some bounds).
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
//   - digest_test.go: digests (tasks of one digest_key to one recipient
//     merged into one message), across a restart, two replicas, a cancel,
//     a pause, and the backlog rule.
//   - policy_test.go: the recipient policy: frequency caps across
//     replicas, quiet hours in the recipient's or the task's zone, test
//     recipients bypassing both, no reservation while a job waits.
//   - digest_policy_test.go: digests under quiet hours and frequency caps.
package dispatch
