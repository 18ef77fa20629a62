// Package scenarios runs the randomized scenario tester (internal/scenario)
// as tests: TestScenarios over fixed and fresh seeds, in process or, with
// -scenario.multiprocess, as separate processes killed with SIGKILL, and
// TestScenarioTapeReplay, which replays a recorded incident. It is its own
// package so that its minutes and e2e's each get go test's per-package
// time limit. Files: scenario_test.go (seeds, flags, the runner),
// multi_test.go (the multi-process stack), tape_test.go (the tape replay).
package scenarios
