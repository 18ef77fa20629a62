// Package status folds outcome events into one progress value per task.
//
// Consumes: stream EVENTS (broadcast.events.>) with the durable consumer
// "status", in stream order, acknowledging each event only after the flush
// that wrote its effect. Not AckAll (one ack per flush): a delivery lost in
// transit (a client reconnect, a consumer leader moving to another node)
// comes back only after the ack wait, and a later event's ack would have
// acknowledged it unfolded; a three-node failover test lost 3 of 1,000
// outcomes that way.
//
// One folder: any number of status processes may run, but only the holder
// of the lease contract.StatusFoldLease in KV broadcast_leases consumes and
// writes (foldlease.go); the others stand by and serve the dashboard. It
// answers on broadcast.alive.status.<replica> so that a standby takes a
// killed holder's lease at once (package lease).
//
// Publishes: KV broadcast_progress (key = task id, value = contract.Progress),
// written at most every flush interval (not once per event), and a
// checkpoint per task in object store broadcast_status.
//
// Exactness: every event carries its recipient's index; the fold keeps one
// outcome byte per recipient (none, retrying, sent, failed, skipped, expired,
// cancelled), so a redelivered or duplicated event finds its recipient
// already in that state and changes nothing. The outcome array is
// checkpointed before events are acknowledged, so after a crash the
// unacknowledged events are folded again onto the last checkpoint with the
// same result.
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
// depths.
//
// Where to edit what: status.go (the consume and flush loop), foldlease.go
// (taking, keeping and checking the fold lease), fold.go (how
// an event changes a task's progress, receipts included), checkpoint.go (saving and loading
// fold state), rate.go (smoothed rate and ETA), dashboard.go (what the
// dashboard shows, queue polling), retention.go (removing old finished
// tasks), http.go (routes), guard.go (who may
// use the dashboard: Host check, token, stream cap), breaker.go (the
// per-task circuit breaker), alerts.go (what calls ALERT_URL), score.go
// (accounts' health scores, KV broadcast_scores), web/ (the page),
// config.go (settings).
package status
