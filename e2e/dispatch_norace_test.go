//go:build !race

package e2e

// raceDetector reports a -race build (see dispatch_race_test.go).
const raceDetector = false
