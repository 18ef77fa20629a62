//go:build !race

package dispatch

// raceDetector reports a -race build (see dispatch_race_test.go).
const raceDetector = false
