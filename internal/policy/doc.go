// Package policy is the recipient policy across tasks that dispatch
// applies right before a send: the live view of KV broadcast_policy
// (view.go), the recipient's time zone for quiet hours (zone.go), and the
// per-recipient counts behind the frequency caps, kept in KV
// broadcast_frequency and changed only by compare-and-set so every
// dispatch replica sees one count (frequency.go).
//
// Which policy applies: the channel's key when present, else "default",
// else none. Transactional messages and test sends (a task's
// test_recipients) bypass caps and quiet hours and are not counted;
// dispatch decides that (services/dispatch/policy.go). A digest is one
// message: its reservation counts once under every cap that limits a
// category of its items (Counter.ReserveMessage), and Usage checks its
// items against the caps without reserving.
package policy
