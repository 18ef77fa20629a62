// Package ingest turns submitted tasks into render work.
//
// Consumes: stream TASKS (subject broadcast.tasks) with the durable consumer
// "ingest".
//
// Publishes:
//   - KV broadcast_tasks: one record per accepted task id (create-only, so a
//     repeated id is ignored long after the stream's duplicate window);
//   - broadcast.events.<task>.accepted with total and duplicates, or
//     broadcast.events.<task>.rejected with the field and reason;
//   - broadcast.render.<task>: recipients in batches, each with a
//     Nats-Msg-Id, so a crash mid-expansion never enqueues a batch twice.
//     A batch holds Config.BatchSize recipients, or 16 per account of the
//     task's pool when that is more (up to 16,000), so render can still
//     group an account's jobs in a message; the size is kept in the task's
//     record, and a resumed expansion cuts alike (expand.go).
//     Lists from the object store are read in two streaming passes with a
//     checkpoint about every 32,000 recipients (stream.go); batches published again
//     after a crash (those past the checkpoint that the interrupted flush
//     may have published, or every batch of an inline task) are marked
//     Resumed, so their jobs are checked against dispatch's ledger.
//
// Scheduled tasks (send_at) hold nothing per recipient until due: ingest
// stores a JetStream scheduled message that fires a second early on
// broadcast.start.<task>, consumed by "ingest-start", waits for send_at,
// marks the task processing and then publishes its recipients (start.go;
// the other order parked jobs that reached dispatch first). A start that
// was cut short between the two is finished when its message comes back.
// Test recipients go first and the task waits for approval; approving
// publishes the rest and marks the task processing last. Each step is a
// compare-and-set on the task's control value: a cancel or pause wins, and
// a start that waited for send_at never sends an approved task back to
// approval. Control requests judge the task by the bucket, not by the
// watch's view, which may lag.
//
// Tasks that do not decode at all still get a rejected event and progress,
// under the id the message carries (the id field or its Nats-Msg-Id header),
// or under a fresh ULID that is logged with the TASKS sequence.
//
// Where to edit what: ingest.go (its start, each step tried again while
// the server restarts (shared.SetUp), the consumer and the handler's steps),
// validate.go (checks that need configuration: channel, accounts),
// expand.go (recipient dedup, batch size and batching), start.go (scheduled starts and
// releases), control.go (pause, resume, cancel, approval, retry-dead,
// which lifts a pause a finished task outran; served concurrently, one
// task's state changes in order), retrydead.go (asking
// dispatch to re-queue dead letters and parked jobs), recipients.go
// (reading JSONL and CSV lists, their limits), stream.go (expanding a list
// from the object store in two passes, pinned by its digest), keepalive.go
// (keeping live tasks' records past the buckets' TTL, approval deadline;
// finished and forgotten tasks' records age out),
// config.go (settings).
package ingest
