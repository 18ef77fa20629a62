// Package status folds outcome events into one progress value per task.
//
// Consumes: stream EVENTS (broadcast.events.>) with the durable consumer
// "status" (one per partition, "status-<k>-of-<n>", with STATUS_PARTITIONS
// above 1), in stream order, acknowledging events only after the flush
// that wrote their effect: one acknowledgement per flush, of its last
// event, which acknowledges every event before it (AckAll). So the fold
// never passes a gap: each event must be the delivery right after the
// last one taken in (its consumer sequence) and later in the stream. A
// delivery lost in transit (a pull that expired with events on the way, a
// client reconnect, a consumer leader moving to another node, another
// client pulling), a redelivery after the ack wait (behind newer events)
// or an event that cannot be folded now makes it flush, drop what waits,
// reset the consumer to its acknowledgement floor and pull again from
// there (status.go, rewind), instead of acknowledging the lost event
// unfolded (a three-node failover test lost 3 of 1,000 outcomes to AckAll
// without the check) or waiting the ack wait for it. A consumer made with
// another ack policy by an earlier version is made again, starting after
// its acknowledgement floor (partition.go). One acknowledgement per event
// cost the server a message and a permission check each, about 8 of its
// 74 µs per message of a whole send (docs/performance.md). It pulls in
// paced batches (status.go, receive): at rest one long pull waits for the
// next event; while events come, one pull every 50 ms takes what gathered
// (at once after a failed attempt, for the circuit breaker), so a busy
// fold costs a read per pull, not per event. Progress is written every
// Config.FlushInterval (STATUS_FLUSH_INTERVAL, 500 ms), and 20 ms after a
// fold turned a task final (finalFlushDelay), so a task's end shows
// within a pull's pace of its last outcome (finalflush_test.go).
//
// One folder per partition: any number of status processes may run, but
// only the holder of a partition's lease in KV broadcast_leases
// (contract.StatusFoldLease with one partition, status.fold.<k>-of-<n>
// with more) consumes and writes its tasks (foldlease.go); the others stand
// by and serve the dashboard. A flush asks the lease before each task's
// write and again between its checkpoint and its progress: a write that
// waited out a lost connection succeeds after the reconnect, when a
// standby may hold the partition (foldlease_test.go). Progress is written
// over the revision its writer knows (KV Update, progresswrite.go), so a
// write that reached the server after the next holder's is refused
// instead of replacing newer progress. Config.Partitions (STATUS_PARTITIONS, default
// 1) splits the fold by task id (partition.go): each partition has its own
// consumer, delivered every event, and folds only its tasks, and the
// processes take the partitions in equal shares (lease.FairShare, under
// status-replica.<id>), so the fold's writes spread over them. Partition 0
// also counts every event into the accounts' health scores, and does the
// work that is not by task (retention, scores, alerts of account pauses).
// A process answers on broadcast.alive.status.<replica> so that a standby
// takes a killed holder's lease at once, beyond its share if need be; the
// killed process then no longer counts among those sharing the
// partitions, so none is handed back to it while its last announcement is
// still fresh (package lease). The holder of partition 0 removes the fold
// consumers of another partition count once no process of that count
// holds a fold lease (layouts.go), and a fold consumer found gone (removed
// by hand) is made again at the next pull, after the fold consumers left.
//
// Publishes: KV broadcast_progress (key = task id, value = contract.Progress),
// written at most every flush interval (not once per event), a
// checkpoint per task in object store broadcast_status, and one entry per
// recipient outcome in the recipient index, stream LOOKUP
// (broadcast.lookup.<hash of the recipient>, contract/lookup.go),
// gathered and published together before each flush (or once 1,024
// wait), without waiting, as plain messages with one acknowledgement
// asked in every 256 to hold the fold back from the server's ingest
// limit (lookup.go).
//
// Series: the folding process also counts what it folds per second (an
// hour) and per minute (a day), per task and per account, in fixed rings
// of at most SeriesLimit series of each kind (series.go); the dashboard
// samples each account's effective rate, ceiling and queue depth into
// them every second and drops a deleted account's. A standby has none,
// nor does a process without a dashboard (DASHBOARD_ADDR=off).
//
// Exactness: every event carries its recipient's index; the fold keeps one
// outcome byte per recipient (none, retrying, sent, failed, skipped, expired,
// cancelled), so a redelivered or duplicated event finds its recipient
// already in that state and changes nothing. The outcome array is
// checkpointed before events are acknowledged, so after a crash the
// unacknowledged events are folded again onto the last checkpoint with the
// same result. They must come in stream order: a dead letter's re-queue
// event (failed back to retrying) folded after the re-queued job's new
// outcome would undo it. So whoever takes a fold lease first resets the
// partition's consumer to its acknowledgement floor (status.go,
// replayUnacknowledged): what the previous holder was handed comes again
// before anything newer, instead of after its ack wait. A progress write
// the server acknowledged and then lost (nats-server killed before its
// write cache reached the file) is not folded again, since its events are
// acknowledged; nor is one lost by a status process killed between a
// flush's checkpoint and its progress write. A flush saves the checkpoint
// first, noting in its metadata the updated_at of the progress it then
// writes, so at the first flush of a holding and after each reconnect the
// holder writes again every task of its partition whose checkpoint names
// a later updated_at than its stored progress, or has no progress
// (reconcile.go): a finished task reopened by retry-dead included, and
// never a write back. That check reads the checkpoints' descriptions and
// the progress values in one pass of a watcher each, side by side, not a
// request per task, as it holds up the fold: 0.25-0.29 s among
// 20,000 tasks (go test ./services/status -bench Reconcile).
//
// Receipts (delivered, read, undelivered events from services/feedback)
// are folded into a second byte per recipient, the strongest receipt seen
// (undelivered < delivered < read: positive evidence of arrival wins, so
// the counts do not depend on the order receipts arrive in), counted only
// for sent recipients, so delivered, read and undelivered never exceed
// sent. They update finished tasks too; the byte is checkpointed with the
// outcomes (a checkpoint without it loads with none).
//
// Account health scores: the folding process counts each account's
// outcomes per minute over the last hour (sent, receipts, blocks, attempts
// refused as too fast) and writes its score (contract.HealthScore) to KV
// broadcast_scores every 5 s (score.go); a process that takes over the
// fold starts from those windows.
//
// Serves (when Config.DashboardAddr is set): the live dashboard, its JSON
// API and server-sent events, the control buttons (forwarded as requests on
// broadcast.control.<task>) and /metrics. The dashboard reads KV
// broadcast_progress, broadcast_accounts and broadcast_health, and polls
// the JOBS consumers of dispatch (one per account and priority) for queue
// depths. The operator's pages (story.go) read a task's dead letters
// (stream DEAD), its events (EVENTS, by the task's subjects) and the
// recipient index (LOOKUP) through short-lived consumers, via package
// client, and forward a retry of selected dead letters as a retry-dead
// control request with their sequences.
//
// Where to edit what: status.go (its start, each step tried again while
// the server restarts (shared.SetUp), the consume and flush loop, the replay
// in stream order at a take-over, the acknowledgement per flush and the
// rewind past a gap, the early write of a final task; replay_test.go,
// acknowledge_test.go, sequence_test.go, finalflush_test.go), reconcile.go
// (progress written again where a lost write left it behind its
// checkpoint; reconcile_test.go), partition.go (the partitions: names,
// which tasks, where a new consumer starts, making a removed one or one of
// another ack policy again), layouts.go (removing another partition
// count's consumers),
// foldlease.go (taking, keeping and checking a partition's lease),
// progresswrite.go (progress written fenced by its revision), fold.go (how
// an event changes a task's progress, receipts included), checkpoint.go (saving and loading
// fold state; checkpoint_test.go checks a write leaves no goroutine
// behind, a leak of nats.go before v1.56.0), rate.go (smoothed rate and ETA), dashboard.go (what the
// dashboard shows, queue polling), retention.go (removing old finished
// tasks), http.go (routes), guard.go (who may
// use the dashboard: Host check, token, stream cap), viewer.go (what the
// viewer token may see), breaker.go (the per-task circuit breaker),
// alerts.go (what calls ALERT_URL), score.go (accounts' health scores,
// KV broadcast_scores), series.go (the charts' bounded series and their
// sampler), story.go (the operator's routes: a task's story, series,
// lookup, retry of a selection), lookup.go (publishing the recipient
// index), web/ (the pages: index.html and app.js the live dashboard,
// task.html and task.js a task's story, account.html and account.js an
// account's charts, lookup.html and lookup.js the recipient lookup,
// chart.js the SVG charts, style.css), config.go (settings).
package status
