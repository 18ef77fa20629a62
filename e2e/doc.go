// Package e2e holds end-to-end tests: all four services in one process
// (internal/pipelinetest; feedback beside them where receipts are tested)
// against an embedded nats-server or a three-node
// cluster, with real HTTP and SMTP stand-ins for the providers, and two
// that run the services as OS processes (`broadcast setup`, a nats-server
// restart). The tests of how dispatch sends (pacing, pools, caps,
// failover, priorities) are in e2e/dispatch, those of digests and the
// recipient policy in e2e/crosstask, the tests that kill processes in
// e2e/process, the randomized scenario tester in e2e/scenarios: their own
// packages, so that each test binary stays well inside go test's ten
// minutes. See docs/testing.md.
//
// Helpers: the pipeline's test configs, submitting tasks and operator
// actions, reading KV, dead letters and events, and the provider stand-ins
// (a recorder of send requests with the pacing figures, the
// fault-injecting gateway behind it, the SMTP fake) are in package
// e2e/harness. Those of some of the tests here, one file each:
//   - security_helpers_test.go: the users of nats.conf and .env, a server
//     from nats.conf, submitting as the operator, leak checks.
//   - feedback_helpers_test.go: the pipeline under nats.conf's users with
//     feedback as its own user, a webhook gateway and a Graph API stand-in
//     that record what they accepted, and the fold rule's expected counts.
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
//   - feedback_wxpusher_test.go: WxPusher's statuses polled, across a
//     restart of feedback; feedback_quality_test.go: WhatsApp quality
//     updates and the health score; feedback_digest_test.go: a digest's
//     receipt counted in every task it carried.
//   - suppress_test.go, stop_test.go: the suppression list, honoured by
//     render and dispatch and fed by receipts, bounces and stop replies.
//   - alerts_test.go: ALERT_URL called once per subject.
//   - setup_test.go, restart_test.go: as processes, `broadcast setup`
//     before or after the services, nats-server restarted;
//     startup_timeout_test.go: every service started while its first
//     requests time out.
package e2e
