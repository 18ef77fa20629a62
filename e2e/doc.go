// Package e2e holds end-to-end tests: all four services in one process
// against an embedded nats-server and a real HTTP gateway.
//
// TestScenarios (scenario_test.go) is the randomized scenario tester of
// internal/scenario: fixed seeds plus fresh ones in process by default;
// -scenario.seed=N replays one seed, -scenario.n / -scenario.duration run
// many (the long mode), -scenario.multiprocess runs each service as a
// process with kill -9 and nats-server restarts (scenario_multi_test.go),
// -scenario.known fails on the known causes being fixed elsewhere too.
// TestScenarioTapeReplay (scenario_tape_test.go) records a faulty run,
// tapes it (internal/tape) and plays it back. See docs/testing.md.
package e2e
