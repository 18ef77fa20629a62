// Package render fills each recipient's message before it is enqueued.
//
// Consumes: stream RENDER (broadcast.render.<task>) with the durable consumer
// "render": recipient batches published by ingest. Reads the task spec from
// KV broadcast_tasks and the accounts from KV broadcast_accounts, and
// watches KV broadcast_suppressions (internal/suppress: an in-memory view
// of hashes only, shared with dispatch when Config.Suppressions is set).
// Config.Concurrency batches render at once, holding at most
// Config.RecipientsInFlight recipients together: the batches of 16 per
// account of a task over 1,000 accounts render one at a time, so the
// first reaches dispatch after a quarter of the time four together take.
//
// Publishes:
//   - broadcast.jobs.<account>.<priority>: one job per recipient with the final
//     text, carrying the task's category (marketing when unset), in job
//     groups: up to Config.JobsPerMessage (RENDER_JOBS_PER_MESSAGE, 24)
//     jobs of one account in a message, one a line, an account's jobs of
//     a batch split evenly over as few messages as that allows
//     (grouping.go). The
//     grouping is recorded in KV broadcast_groupings (key
//     <task>.<first index>) before any job of the batch is published, and
//     a batch rendered again groups as recorded: a group's Nats-Msg-Id
//     names its first job and size (contract.GroupMsgID), a job alone has
//     its job id, so re-running a batch never enqueues a job twice within
//     the stream's duplicate window; jobs of a batch
//     rendered before (redelivered, or marked Resumed by ingest after a
//     crash) carry Recheck, so dispatch checks its ledger before sending
//     them, beyond that window too;
//   - broadcast.wake (core NATS, contract.SubjectWake): the accounts of a
//     batch's jobs, each once, before they are stored, so dispatch wakes
//     its sleeping ones ahead of them (announce in render.go);
//   - broadcast.events.<task>.skipped for recipients that cannot be sent: a
//     recipient on the suppression list for the task's channel (or all)
//     and category (code suppressed; the error names the entry's scope and
//     reason, not the recipient), an invalid address, a template variable the recipient lacks or has as
//     null (templates run with missingkey=error, and an output that would
//     read "<no value>" is refused: contract.ErrNoValue), a body over the channel's
//     limits, a job too large for the server's max_payload (code too_large);
//   - for a batch it gives up on (its task has no usable record, it does
//     not decode): a skipped event (code render_failed) for each of its
//     recipients, and one letter without a job on broadcast.dead.<task>
//     holding the reason and the start of the raw batch (giveup.go);
//   - broadcast.events.<task>.retrying, task-level (index -1, code
//     no_enabled_account), while none of the task's accounts is enabled:
//     the batch is held and asked for again after NoAccountRetry
//     (noaccount.go), so progress says why nothing moves; the warning is
//     logged once a minute per task, not per batch.
//
// A batch's jobs and events go out without waiting each
// (shared.Publisher); the batch is acknowledged once all are stored, and
// retried when any is refused or unacknowledged after 30 s.
//
// Templates of only text and {{.name}} fields whose values are strings
// (most) are filled directly; anything else runs text/template with its
// execution budget (contract.Template). Jobs are encoded with go-json
// (contract.EncodeJob, the same bytes as encoding/json).
//
// Where to edit what: render.go (its start, each step tried again while
// the server restarts (shared.SetUpAll), the consumer and per-recipient
// steps, the suppression check among them), grouping.go (job groups and their
// record),
// giveup.go (batches given up on), noaccount.go (batches held for an
// enabled account), spec.go (the cached task spec), digest.go (a task's
// digest fields copied into its jobs), config.go (settings);
// noaccount_test.go tests the held batches' warning, grouping_test.go the
// groups and a batch rendered again, inflight_test.go the bound on the
// recipients rendered at once; helpers_test.go starts their server and
// service.
// Account choice is a shared.Balancer per batch: PickAccount's weighted
// rendezvous hash (capacity-weighted, sticky per recipient), with no
// account taking more than its share of the batch, rounded up, plus
// Config.AccountSlack percent (RENDER_ACCOUNT_SLACK, default 0).
package render
