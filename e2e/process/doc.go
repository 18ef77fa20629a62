// Package process holds the end-to-end tests that run nats-server and the
// services as OS processes (internal/proctest) and kill them with SIGKILL
// during a broadcast, checked against gateways that keep their own
// ledger: nothing lost, nothing repeated, how soon sending resumes. They
// run one at a time (each owns the machine's timing) in their own package,
// beside the in-process tests of e2e. See docs/testing.md.
//
// Files:
//   - stack_test.go: a test's own nats-server, gateway and client, and
//     starting the services on that server.
//   - chaos_helpers_test.go: the client of a nats-server run as a process
//     (the account, the task, progress).
//   - chaos_test.go, chaos_status_test.go: dispatch and status killed again
//     and again during a broadcast (the dispatch one, about 100 s, only
//     with BROADCAST_CHAOS=1, as .ci/run runs it).
//   - dispatch_kill_test.go, status_replicas_test.go: the lease holder of
//     two dispatch or two status replicas killed (how soon the other takes
//     over; progress stays exact).
//   - dispatch_kill_accounts_test.go: two dispatch processes holding two
//     accounts each, one killed; the survivor, already at its share, takes
//     the killed one's accounts within about a second.
//   - status_partitions_test.go: the fold in four partitions over two
//     status processes, one killed and restarted (the share, the take-over,
//     exact progress of a task in each partition).
//   - progress_watch_test.go: every progress value written, per task, for
//     how soon progress moves and whether it ever went back.
//   - feedback_kill_test.go: feedback killed twice during a storm of
//     receipts from posters that retry; progress equals what they had
//     answered 200.
//   - digest_kill_test.go: dispatch killed in the middle of a digest
//     window; one request per recipient, one sent event per item.
//   - nats_restart_test.go: nats-server killed twice under the lanes'
//     in-memory consumers.
//   - churn_test.go: the memory soak (BROADCAST_SOAK=1), months of task and
//     account churn with flat resident memory.
package process
