// Package scenario is the randomized scenario tester of issue 12: it draws
// a scenario from a seed (accounts of every channel with a fake, tasks,
// provider faults, operator actions, process kills, the recipient policy,
// status's partitions, queued jobs published again as a resumed expansion
// does once the duplicate window forgot them), runs it against a
// whole Broadcast and checks, from the fakes' own ledgers and from KV, the
// promises of the contract:
//
//   - no valid recipient of a finished task is lost;
//   - a recipient is accepted twice only under one idempotency key, and
//     only when a send to it timed out, was answered after the client gave
//     up, or was in flight at a kill;
//   - progress equals the ledgers (sent = distinct recipients the fakes
//     accepted = distinct sent events) and its counts add up to total;
//   - no account sent more than rate+burst requests (calls, for batch
//     accounts) in any one-second window, as the fake received them, nor
//     more distinct recipients than its daily cap;
//   - two accepted sends to one recipient through one account are at
//     least per_recipient_interval apart;
//   - every task is final within a bound computed from its rates, or
//     paused / waiting with the reason in progress's error;
//   - the recipient policy (issue 17): a recipient suppressed for the
//     task's channel and category before the task was submitted is never
//     accepted and is skipped with code suppressed; no recipient is
//     accepted by more marketing tasks than the frequency cap, kills or
//     not; a frequency_cap skip only on a capped task for a recipient
//     other capped tasks reached; policy skips are counted in skipped;
//   - digests (webhook): an item's sent event names a message the
//     provider accepted with the item in it; per task and recipient the
//     ledger, duplicate and gap checks hold as for single sends.
//
// Failures caused by bugs being fixed elsewhere are marked with a known
// cause (Known* in check.go) so the default test run can tolerate them
// until the fixes merge.
//
// The e2e test TestScenarios and the `broadcast torture` command share it;
// a failing scenario prints its seed, its JSON, a shrunk variant and the
// command that replays it.
//
// Where to edit what:
//   - scenario.go: the Scenario struct and Generate (what a seed draws;
//     genPolicy draws the recipient policy from a stream of its own).
//   - fakes.go: the provider stand-ins and their ledgers (Hit): the
//     webhook fake (internal/gateway behind a recorder that also answers
//     late and splits a digest into a hit per task), WxPusher, WhatsApp
//     and SMTP (on internal/fakes' SMTP server); sandbox accounts have
//     none.
//   - stack.go: Stack, and StartInProcess (embedded server, four services).
//   - procstack.go: StartProcesses, the multi-process stack (replicas of
//     each service, kill -9, nats-server restart); procstack_unix.go /
//     procstack_other.go: process groups where the OS has them.
//   - run.go: Run, the runner: fakes, accounts, the policy and the
//     suppression entries, tasks, the timeline of actions (repeatJobs
//     publishes queued jobs again) and kills, collecting the observation.
//   - check.go: Check and the known causes; policy, frequencySkip and
//     frequency judge the recipient policy.
//   - rate.go: the rate check's windows: each request the fakes received
//     paired with when dispatch began it (call_started_at), so a window
//     is judged without requests held up on their way.
//   - stall.go: Stall and the probe that notes when the runner's process
//     (where the fakes stamp requests) did not run, reported with each
//     scenario and each rate failure.
//   - shrink.go: Shrink, smaller failing variants.
//   - report.go: Report, RunAndCheck, ReplayCommand.
//   - torture.go: Torture, the long mode behind `broadcast torture`.
package scenario
