// Package dispatch sends jobs through sender accounts, paced so accounts are
// not throttled or banned, and never loses or repeats a message.
//
// Consumes: stream JOBS, a durable pull consumer per account and priority
// lane: "dispatch_high-<account>", "dispatch-<account>" (normal) and
// "dispatch_low-<account>", filters broadcast.jobs.<account>.high, .normal
// and .low, created and resized live as KV broadcast_accounts changes. The
// normal lane's exists while the account has work and this replica holds
// its lease (idle.go: an account without work for Config.SessionIdle,
// DISPATCH_SESSION_IDLE, 10 s by default, sleeps, with no lease, no
// pull request and no timer, leaving a mark in KV broadcast_lanes that
// names the last JOBS sequence, so the jobs after it that wake it count as
// fresh; up to Config.KeptConsumers, DISPATCH_KEPT_CONSUMERS, 1,000 by
// default, of a replica's sleeping accounts keep the normal lane's
// consumer, so that waking them asks the server for none, and the others'
// is deleted; a wake notice from render on broadcast.wake, core NATS,
// naming a sleeping account starts its session before its jobs are
// stored); the high and low lanes' only while they hold jobs (lanes.go:
// every consumer of JOBS costs the server on every acknowledgement; a
// closed lane leaves a mark in the normal consumer's metadata so its next
// jobs count as fresh). Each lane's
// MaxAckPending is the account's concurrency (so held jobs of one lane
// never stop another lane's delivery) and its client buffer is no larger.
// Their state is kept in memory (consumerConfig in account.go says why), so
// a server restart loses them with what they delivered: each consumer is
// made with a mark in its metadata naming the last JOBS sequence then
// (recheckMark), and whichever replica consumes it checks the jobs up to
// the mark for an earlier send when they come (delivery.recheck), also
// after a take-over from a replica that made the consumer and died.
//
// One sender per account: only the holder of the account's lease in KV
// broadcast_leases (package lease: key <account>, value the runner's instance id,
// bucket TTL shared.LeaseTTL = 5 s) consumes its lanes, so its local token
// bucket (golang.org/x/time/rate, rate_per_sec with burst) is the account's
// rate across every replica. The holder refreshes the lease every second
// (KV Update with the revision) and starts no send once the lease cannot be
// confirmed fresh: it counts it valid until its last successful refresh
// began plus the TTL minus 1.5 s, so a former holder's last send starts at
// least 1.5 s before anyone else can hold the lease. How long refreshes
// take and why sessions end (idle, lease lost, ...) are metrics
// (broadcast_lease_refresh_seconds, broadcast_account_sessions_ended_total). A stopping holder
// deletes the lease after its in-flight sends and the standbys (the other
// replicas' runners, which watch the key and retry every second while the
// lane finder shows jobs for the account) take over at once. A killed one's lease
// is taken at the standbys' next try (lease.Presence: its alive subject,
// broadcast.alive.dispatch.<id>, has no responders once the server closed
// its connection); otherwise it expires. Replicas take the accounts in
// equal shares (lease.FairShare); a standby at its share asks the same
// question of the replicas it counts before it refuses, so a killed
// replica stops counting at once and its accounts are taken then too. A holder whose connection drops
// starts no send until it confirmed its lease after reconnecting: the
// lease is checked at a job's grant and again right before its call, since
// a step between them (the frequency reservation, a KV write) can wait out
// the loss and succeed after the reconnect, when a standby that heard the
// holder gone may hold the lease (scheduler.stillValid). The call passes
// the same check to the channel (channels.WithSendGate), which asks it
// again once its connection is ready: an SMTP server slow to greet can
// outlast the lease, and a message not written then comes back like one
// stopped before its call. The
// lanes' ack wait is 2 s, with progress acks every second for slow sends
// and waiting jobs, so the jobs a killed holder took come back about 2 s
// after the kill. A progress ack that comes late (a loaded machine) lets
// the server deliver a job again while its delivery is still handled here,
// waiting in the batcher, in its call or for its sent event to be stored,
// where sentBefore would find no outcome yet: such a redelivery is left
// unsettled, without a step (live.go), and the delivery in hand settles
// the message for both (the server takes any delivery's ack, NAK or
// progress ack by stream sequence); it spends no attempt. A new holder
// starts with an empty bucket (pacer.empty). The lease replaced a pinned priority group on a single consumer, because a
// pin is per consumer: with one consumer per lane two replicas could have
// owned different lanes of one account and together exceeded its rate.
//
// Priority (sched.go): the holder's scheduler hands the next token, and a
// slot of the in-flight cap (at most concurrency provider calls across the
// lanes), to a waiting high job before a normal one before a low one, and
// serves a lower lane only while every higher lane is idle: no job in its
// handlers outside the provider call, and none unacknowledged on the server
// (watchBacklog in account.go asks while a lower lane waits, a closed high
// lane answered from the lane finder's look; a job that
// began in a lane keeps it marked until an answer asked after that job
// says it is empty, so a stale "empty" cannot let a lower lane in). A high
// task therefore takes the account's whole rate while it has work, low
// yields to both, and the total never exceeds rate and burst: the pacer
// admits at most rate + burst send starts in any 1.02 s, the margin
// covering network jitter at the provider, which counts arrivals. Tokens
// leave in ticks: a waiting scheduler lets 10 ms worth gather (at most
// half the burst) and grants them together, so at high rates the jobs'
// messages share system calls and wakeups (pacer.grantBatchLocked). A
// scheduler that wakes late for the token of a bucket one token deep
// takes it as of the moment it waited for, so a busy CPU does not push
// the account's schedule back (every late wake was lost to the rate); a
// deeper bucket keeps filling meanwhile. A job
// whose turn is due at once (nobody ahead, no higher lane busy or queued,
// a slot and a token free) is granted in its own goroutine, without a hop
// through the scheduler's. A job waiting for its turn checks its task's
// run state, its expiry and the account's health every 500 ms, so a pause
// or cancel still applies within a second; once granted, it checks the
// task's run state and the account's health again before its call.
//
// Per job (send.go: handle and its steps): a job that may have been
// handled before (redelivered, or marked Recheck when re-published or
// rendered by a resumed expansion) is first checked for an earlier send
// (sentBefore), so one already sent is acknowledged without sending.
// Then mayStillSend checks expiry, the task's run state, the suppression
// list (KV broadcast_suppressions, through the watch-backed view of
// internal/suppress, shared with render when Config.Suppressions is set,
// by the job's channel, recipient and category: a
// listed recipient gets a skipped event with code suppressed, so an
// entry added while the job was queued or parked still stops it) and the
// account's health. Then obeyPolicy (policy.go) applies the recipient
// policy of the job's channel (KV broadcast_policy through internal/policy:
// the channel's key, else default), except to transactional jobs, test
// sends (Job.Test: neither held nor counted) and a digest's carrier,
// whose items the digest step checked one by one: a recipient inside its
// quiet hours, in its own zone (variable tz, else the task's defaults tz
// carried as Job.TaskTZ, else its phone number's region, else the
// policy's default_tz, else UTC), is
// re-published for their end as a scheduled message (no slot held, no
// attempt spent; expires_at still wins) with a retrying event coded
// quiet_hours; one over a frequency cap is skipped, code frequency_cap;
// otherwise its send is reserved by job id in KV broadcast_frequency
// (compare-and-set, shared by every replica; once the job's turn comes,
// in sendDirect, or for a batch account once admitCaps admits it, so a
// job waiting holds no reservation) and released by send when the
// call did not reach the recipient, or by mayStillSend when a redelivered
// job ends unsent (expired, cancelled, suppressed), unless an earlier send
// of the job may have reached the recipient (it timed out, or its answer
// was lost: maybe_sent): that reservation counts until its window passes.
// Config.Now is the policy's clock.
// Successes are known from the task's stored sent events (sentindex.go:
// each is stored before its job is acknowledged, so it costs nothing per
// send; a task's events are read by one forward-only ephemeral consumer,
// its order checked, recreated where it stopped when it vanishes; lookups
// that queue behind a read of the task share it); the
// ledger, KV broadcast_ledger (key <task>.<index>, ledger.go), keeps
// attempt errors, and a sent record only when the event could not be
// stored (or is not known to be). Fresh jobs skip the lookups. A
// redelivery whose previous delivery left no outcome in the ledger (the
// entry names the delivery it holds last by stream sequence and delivery
// count, as attempt numbers repeat across moves), or a job queued before
// its consumer lost its state, may follow a send whose answer was lost:
// its later outcomes say maybe_sent (Job.MaybeSent), its retrying events
// too. Its copies carry the mark, and its ledger entry keeps it with the
// next attempt error, for the redeliveries after that. A delivery handed
// back at its session's end before its call (a stop, a hand-over, a lost
// lease; a job group's parts not begun) records itself in the entry as
// left unsent (noteLeftUnsent), so its redelivery knows no answer was
// lost. A sent event
// is published asynchronously (shared.Publisher) and the job acknowledged
// by the consume loop once the event is stored (shared.Later), so no
// handler waits on it; sent events carry no Nats-Msg-Id (the lookup before
// a re-publish is their deduplication), other events do, and an outcome
// of a delivery names it there (Event.JobSeq and Delivery: its JOBS
// message and delivery count), as attempt numbers repeat across moves and
// held jobs and a second "retrying #1" was dropped as a duplicate. The channel
// adapter is called with the job id as Idempotency-Key; the answer is
// classified (contract.ErrorClass).
//
// Job groups (jobgroup.go): a message may carry several jobs of the
// account, one a line (render's job groups). Each goes through the steps
// above as if delivered alone, under the message's delivery, each
// beginning once the one before waits for its turn (so the account still
// sends in the list's order). A lane holds at most its account's burst
// and a tenth of a second of its rate (at least one job) in jobs waiting
// for their turns (groupJobsWaiting; a batch account's jobs count until
// they are done), so a process with many accounts does not hold a
// goroutine for every job delivered; the message is acknowledged when
// all are done, a job given up dead-lettered as it is. A failed send's
// retry comes back alone as a scheduled copy (delayJob, whatever its
// delay), so the others are not handled again; only a job that could not
// finish (stopping, a lost lease, a failed store) has the message NAKed,
// and its redelivery finds the others done (sent events, the ledger's
// give-ups and hand-offs). MaxAckPending then counts messages; the
// scheduler's slots still cap the provider calls at the account's
// concurrency.
//
// Batch accounts (max_batch > 1, e.g. WxPusher's 2,000 uids per call): jobs
// stay one per recipient in JOBS, and each still goes through every per-job
// step, but instead of calling the adapter itself a job joins the account's
// batcher (batcher.go), which makes one call per group of jobs with
// identical text: when the group is full, when no job joined it for
// batchLinger (150 ms, not counting time in which earlier calls' jobs are
// still settling or handlers hold jobs on their way to the batcher), or
// after batchMaxWait (2 s). For these accounts
// rate_per_sec and concurrency count provider calls (one token per call,
// taken only while the lease holds; at most concurrency calls in flight),
// and the account's lanes together hold concurrency×max_batch×4 jobs (at
// most 10,000: half in the normal lane, a quarter in high and in low, each
// at least one call's worth) so groups can fill. The batcher groups by text, not priority.
// Every job gets its own result and outcome, so a partly failed call
// retries only its failed recipients, which merge again with whatever
// waits. A task's pause or cancel, and an account that must not send
// (disabled or paused), are checked again before each call and every
// linger for waiting jobs. Adaptive pacing counts a call as one answer
// (rate limited when any member was). max_batch 1 accounts call the
// adapter from the job's handler, with no extra hop.
//
// Safety: pacing is adaptive. A rate-limit answer is evidence, not proof,
// that the account is too fast, so the law (adapt.go) decides once per
// second from the share of answers refused: refusals as frequent at a
// lower rate as at a higher one are noise and, within twice their usual
// share, leave the rate alone, but a run of refused windows with more
// than 30 % refused (plus two refusals over the run) is never noise, and
// after one the noise is not assumed for a minute; one or two refusals
// without Retry-After in a second spent at or below the rate held under a
// limit found are noise too (a capacity there refuses nothing, or every
// send above it); refusals beyond the noise with most answers accepted
// are a capacity, remembered as a limit, held just below (95 % of
// the rate the provider took) for 20 s and then probed slowly; four
// refusals with nothing accepted for 3 s are a storm (the floor, then back
// to the ceiling by a quarter a second). Linear AIMD cannot both hold a
// capacity with few refusals and ride out noise, hence the distinction.
// Retry-After pauses the whole account wherever a send starts (pacer.go:
// tokens and admit both wait, so a job granted its token before the 429
// does not start during the pause, and takes a new one after it), and the
// bucket is empty afterwards: the sends the pause held leave at the rate.
// daily_cap and per_recipient_interval are enforced over KV
// broadcast_sends (caps.go). A job whose account reached its daily cap
// moves to an account of its pool with capacity left (by the accounts'
// health), or is held with a daily_cap retrying event; held jobs (a
// reached cap, no healthy account) wait on
// broadcast.delay.<account>.held.<job>, and an account edit that adds
// capacity (a new account, one enabled, edited out of a pause, or a cap
// raised or removed) wakes them within a second (wake.go; an account of
// the channel with none held costs one lookup, not a consumer). Account-fatal
// answers or three auth failures (401/403) in a row pause the account (KV
// broadcast_health); its jobs move to healthy accounts of the task's pool
// (reroute in send.go; a pool longer than contract.MaxJobPool is read
// from the task's record in KV broadcast_tasks, pool.go). A job answered
// with either moves too, spending no attempt: an account's problem never
// sends a recipient to DEAD. Moves count in Job.Moves.
//
// Provider signals (KV broadcast_signals, watched; quality.go): a quality
// rating of YELLOW or RED halves the account's rate ceiling until it
// recovers; RED also holds its marketing jobs, which move to an account
// of their pool whose rating does not hold them or wait with a retrying
// event, code quality_red, until the rating changes (a change wakes held
// jobs). The daily cap is the lowest of daily_cap, the warm-up ramp's cap
// for the day (account field warmup) and the provider's messaging limit
// (reported in the signals, else the tier); accounts with the same
// portfolio field share one rolling 24 h count of distinct recipients,
// held to the portfolio's limit, under pf=<portfolio> keys of
// broadcast_sends (limits.go, portfolio.go).
//
// Digests (digest.go): a job whose task has a digest_key (and a
// digest_window, or an account over its digest_backlog: more jobs queued
// on its normal lane than that as the job is delivered, counted from the
// delivery's NumPending and the lane's jobs being handled, so a burst
// merges from the job that finds it queued; digestWindow) joins the digest
// of its channel, recipient and key, an entry of KV broadcast_ledger
// (key dg=<channel>.<recipient hash>.<key hash>, changed by compare-and-set)
// and is acknowledged; the job that opened it carries it, scheduled for the
// end of the window (no slot held), then sends one message rendered with
// its task's digest_template over the items, and publishes each item's sent
// event naming it (carried_by). Items whose tasks cannot send when it is
// due leave as jobs of their own; a carrier that cannot send hands the
// digest to the next item, also one stopped after it sealed the digest,
// before its call (handOverIfStopped, from mayStillSend and the batch
// wait), and one to be held on its account with no account of its pool
// to move to (handOverIfHeld, from reroute and capReached: the items'
// pools may have one). The recipient policy applies item by item: a
// job it would hold or skip now does not join; when the digest is due
// (and on the carrier's later deliveries until an attempt may have
// reached the recipient) items it would hold or skip alone leave, free to
// merge again once back, a carrier it would hold hands the digest on, and
// the digest reserves one send under the frequency caps, by the carrier's
// job id, for every category its items carry. Before its call the carrier
// names the attempt in the entry (SendKey: its job id, the call's
// Idempotency-Key, and SendBody: the text), forgotten after an answer that
// says the call did not reach the recipient. While an attempt is named,
// every later carrier sends that text under that key, taking no item out
// (delivery.sendKey and sendBody; the carrier's job keeps its own text,
// so a copy of it moved, delayed or dead-lettered carries no other
// item's), a stopped carrier stays an item instead of going alone, and a
// carrier that gives up hands the digest on instead of
// releasing the items under their own keys: the recipient never gets it
// under two keys. Items' sent events name the key's job (carried_by).
//
// Publishes: broadcast.events.<task>.<kind> for every outcome (sent,
// retrying, failed, expired, cancelled), and broadcast.dead.<task> for every
// recipient given up on, with every attempt's error (before its failed
// event). Short retries use NakWithDelay with exponential backoff and
// jitter; waits of Config.LongWait or more (long backoff, Retry-After,
// caps, no healthy account) are JetStream scheduled messages on
// broadcast.delay.<account>.<job> (delay.go), which hold no MaxAckPending
// slot. Jobs of paused or unapproved tasks are parked (control.go), on the
// word of KV broadcast_control itself, not of the watch's view, which lags
// under load: a resumed task's unparked jobs must not park again. Every
// re-publication (delayed, moved to another account, unparked, dead letters
// retried) goes back to the lane of the job's own priority. A delivery
// that hands its job on as a copy (parked, moved, delayed, held) records
// the copy in the ledger entry before publishing it with a Nats-Msg-Id
// naming its own message (handoff.go): killed before its ack, its
// redelivery publishes the same copy again, which the duplicate window
// drops, and is acknowledged without sending, so the two never both live.
// The window forgets a copy that was consumed or whose schedule fired
// when a server restart rebuilds it, so the copy also names the record in
// a header (Broadcast-Copy) and the first message delivered with it
// claims the record (compare-and-set in the ledger, claimCopy); a second
// copy is acknowledged without a step, and a redelivered original whose
// copy was claimed publishes none (on the job's schedule subject it would
// replace the schedule of the job's next copy); one that found it
// unclaimed publishes a scheduled copy only onto an empty schedule
// subject (republishCopy), as the copy may be claimed and delayed again
// in between. It answers
// requests on broadcast.alive.dispatch.<replica> (lease.Presence) and on
// broadcast.requeue.<task> (requeue.go).
//
// Where to edit what:
//   - dispatch.go: the service (its start steps tried again while the
//     server restarts, shared.SetUp), starting and stopping account runners
//     (a new account it cannot send with starts paused, with the reason).
//   - account.go: one account's runner: its session while it holds the
//     lease, its lanes' consumers and their recheck marks, the backlog
//     watch, its sender.
//   - lanes.go: opening the high and low lanes when jobs appear, closing
//     them when idle, their closed marks, the lane finder.
//   - lease.go: waiting for the account's lease and keeping it while sending.
//   - idle.go: sleeping accounts without work (no lease, no pull: the
//     asleep mark; the normal lane's consumer kept within
//     Config.KeptConsumers, else deleted), waking them when the lane
//     finder shows jobs (with as few requests as the runner's note of its
//     own mark allows: none about consumers when it kept one), ending
//     idle sessions.
//   - inflight.go: the replica's in-flight budget (the share of the
//     accounts over replicas is lease.FairShare).
//   - sched.go: priority and the in-flight cap.
//   - waitline.go: a lane's jobs waiting for a turn, first come first
//     served, a job whose wait timed out keeping its place.
//   - live.go: the JOBS messages being handled here, so a redelivery
//     that comes while its earlier delivery is still handled is left to it
//     (and a job handed back unsent names the last such delivery in the
//     ledger, for the next delivery in another process).
//   - jobhold.go: the jobs whose deliveries are handled here, so
//     another message of the same job (published again after the
//     duplicate window forgot the first) waits, is checked, and finds
//     the send.
//   - jobgroup.go: the jobs of a job group's message, each as a part on
//     a goroutine of the service's pool (shared.GoPool); recording the
//     jobs of a message that came as the lane stopped as left unsent
//     (leftAtStop).
//   - send.go: handle and its steps, from the check for an earlier send to
//     the outcome (mayStillSend: expiry, run state, suppression, health;
//     then the policy, the account's caps, the call);
//     rerouting off an account that must not send.
//   - batcher.go: merging sends of batch accounts into calls.
//   - health.go: what answers say about the account (pauses, auth
//     failures, the rate they leave) and its value in KV broadcast_health,
//     written when it changes and every 30 s while the account sends.
//   - pacer.go: token bucket, tokens granted in ticks, Retry-After
//     pauses, the one-second bound.
//   - adapt.go: the adaptive rate's control law.
//   - caps.go: daily cap and per-recipient gap, and a portfolio's shared
//     count.
//   - limits.go: which daily cap applies (daily_cap, warm-up, messaging
//     limit) and how a reason names it.
//   - portfolio.go: a portfolio's accounts, limit and shared count.
//   - quality.go: what a quality rating does to pacing and marketing
//     sends, and applying a change of the signals.
//   - policy.go: quiet hours and frequency caps (obeyPolicy,
//     reserveFrequency), the check of a job as if it were sent alone now
//     (policyStops, policyHolds), releasing a reservation whose send did
//     not reach the recipient or whose job ended unsent.
//   - delay.go: scheduled waits, held jobs, moving jobs to other accounts.
//   - digest.go: digests: joining, carrying, the recipient policy item by
//     item, sending and finishing them, and the backlog rule.
//   - handoff.go: copies a delivery publishes in place of its job, their
//     record in the ledger, so a crash before the ack repeats none, and
//     the claim that keeps a copy published twice from being handled
//     twice.
//   - pool.go: the accounts a job may move to (its pool, or its task's).
//   - wake.go: waking held jobs on account edits and signal changes.
//   - reap.go: stopping runners of deleted accounts, and adopting the
//     queues of accounts deleted while no dispatch ran.
//   - requeue.go: re-queue requests (unparking, retry-dead) and the parked
//     sweeper.
//   - retryselected.go: retry-dead of a selection: re-queues the dead
//     letters named by their DEAD sequences and deletes each from DEAD.
//   - control.go: the tasks' pause and cancel.
//   - backoff.go: retry delays.
//   - ledger.go: the ledger, KV broadcast_ledger: attempt errors, sent
//     records whose event could not be stored, and handed-off copies;
//     written by compare-and-set, a write that finds the entry changed by
//     another message of the job keeping what that one recorded.
//   - sentindex.go: the task's sent events as the record of successes.
//   - deadletter.go: giving up (recorded in the ledger first, settleGiveUp
//     in send.go, so a redelivery after a crash gives up again instead of
//     sending); an undecodable job's failed event from the fields that
//     still decode.
//   - config.go: settings.
//   - *_test.go: the tests of the file of the same name; helpers_test.go
//     starts their server.
package dispatch
