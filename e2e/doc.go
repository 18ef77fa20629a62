// Package e2e holds end-to-end tests: all four services in one process
// (internal/pipelinetest; feedback beside them where receipts are tested)
// against an embedded nats-server or a three-node
// cluster, with real HTTP and SMTP stand-ins for the providers, and two
// that run the services as OS processes (`broadcast setup`, a nats-server
// restart). The tests that kill processes are in e2e/process, the
// randomized scenario tester in e2e/scenarios: their own packages, so that
// each test binary stays well inside go test's ten minutes. See
// docs/testing.md.
//
// Helpers: the pipeline's test configs, submitting tasks and operator
// actions, reading KV, dead letters and events, and the provider stand-ins
// (a recorder of send requests with the pacing figures, the
// fault-injecting gateway behind it, the SMTP fake) are in package
// e2e/harness. Those of some of the tests here, one file each:
//   - dispatch_helpers_test.go: dispatch replicas started and stopped one
//     by one (dispatchEnv), with a log of which replica sent what.
//   - security_helpers_test.go: the users of nats.conf and .env, a server
//     from nats.conf, submitting as the operator, leak checks.
//   - feedback_helpers_test.go: the pipeline under nats.conf's users with
//     feedback as its own user, a webhook gateway and a Graph API stand-in
//     that record what they accepted, and the fold rule's expected counts.
//   - dispatch_race_test.go / dispatch_norace_test.go: whether the race
//     detector is on (its slowdown widens some bounds).
//
// Tests:
//   - pipeline_test.go: a 1,000-recipient webhook broadcast against the
//     gateway's ledger; duplicate task ids.
//   - channels_test.go: WhatsApp, WxPusher and SMTP broadcasts.
//   - batch_test.go: batch calls (WxPusher, sandbox).
//   - control_test.go, control_concurrency_test.go: pause, resume, cancel,
//     approval, expiry, retry-dead, the circuit breaker, scheduled starts.
//   - scenario_regress_test.go: bugs the scenario tester found.
//   - checkpoint_test.go, objectlist_test.go, payload_test.go,
//     reject_test.go, giveup_test.go, retention_test.go, metrics_test.go:
//     checkpoints, recipients from the object store, large variables,
//     rejected tasks, every give-up dead-lettered, retention, metrics.
//   - disabled_account_test.go: a task whose only account is disabled
//     waits, says why, and is sent once the account is enabled.
//   - dispatch (its own replicas from dispatch_helpers_test.go, or the
//     pipeline's): dispatch_pacing_test.go (pacing, one and three
//     replicas), dispatch_adaptive_test.go and dispatch_adaptive_law_test.go
//     (adaptive rates), dispatch_pool_test.go (pools), dispatch_caps_test.go
//     and dispatch_capwake_test.go (daily caps, per-recipient intervals),
//     dispatch_failover_test.go (failover, leases), dispatch_share_test.go
//     (accounts shared between replicas), dispatch_priority_test.go,
//     dispatch_ledger_test.go (the send ledger, dead-letter history),
//     dispatch_longwait_test.go (long waits hold no slot).
//   - digest_test.go: digests (tasks of one digest_key to one recipient
//     merged into one message), across a restart, two replicas, a cancel,
//     and the backlog rule.
//   - security_test.go, tls_test.go, hostile_accounts_test.go,
//     secrets_test.go: least privilege under nats.conf's users, TLS,
//     hostile account values, secrets that never leak.
//   - dashboard_test.go: the dashboard in headless Chromium.
//   - operator_test.go: the operator's API (a task's story: failures,
//     dead letters, events, series; recipient lookup; retry of a
//     selection), also under nats.conf's users; operator_browser_test.go:
//     its pages in headless Chromium.
//   - cluster_test.go: a leader killed in a three-node cluster.
//   - feedback_test.go: receipts posted like the providers (shuffled,
//     duplicated, ahead of their sent event, forged, oversized), email
//     bounces; feedback_bench_test.go: the receipts per second feedback
//     sustains (BenchmarkFeedbackReceipts).
//   - alerts_test.go: ALERT_URL called once per subject.
//   - setup_test.go, restart_test.go: as processes, `broadcast setup`
//     before or after the services, nats-server restarted.
package e2e
