// Package crosstask holds the end-to-end tests of what dispatch does across
// the tasks that reach one recipient: digests, which merge them into one
// message (docs/digests.md), and the recipient policy, which caps how often
// a recipient is messaged and holds sends inside quiet hours
// (docs/policy.md). Each runs the four services in one process
// (internal/pipelinetest) against an embedded nats-server and the gateway
// of e2e/harness, some with dispatch replicas of their own
// (harness.DispatchEnv) and the quiet hours on a fake clock. They were part
// of package e2e; they are a test binary of their own so that each package
// of go test ./... stays well inside its ten-minute default timeout. Test
// names start with TestDigest or TestPolicy. See docs/testing.md.
//
// Files, each with the helpers of its tests:
//   - digest_test.go: digests (tasks of one digest_key to one recipient
//     merged into one message), across a dispatch restart, two replicas, a
//     cancel, a pause, a full digest, and the backlog rule.
//   - policy_test.go: the recipient policy: frequency caps across
//     replicas and a restart, quiet hours in the recipient's or the task's
//     zone, test recipients bypassing both, no cap reservation while a job
//     waits.
//   - digest_policy_test.go: digests under quiet hours and frequency caps
//     (it uses the helpers of the two files above).
package crosstask
