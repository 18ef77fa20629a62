package main

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// TestDemoGivesUpOnlyWhenMeant checks that the demo's injected faults
// cannot plausibly exhaust a recipient's attempts: such a give-up would
// be counted as failed and fail the demo's own check (checkDemo).
func TestDemoGivesUpOnlyWhenMeant(t *testing.T) {
	var o channels.SandboxOptions
	if err := json.Unmarshal([]byte(fmt.Sprintf(demoAccount, 150, 75)), &o); err != nil {
		t.Fatal(err)
	}
	task, wantFailed, wantSkipped, _ := demoTask("demo-test", 2000)
	retryable := o.FailRate + o.RateLimitedRate
	if retryable <= 0 {
		t.Fatalf("the demo injects no retryable answers (fail_rate %v, rate_limited_rate %v)", o.FailRate, o.RateLimitedRate)
	}
	attempts := task.MaxAttempts
	if attempts == 0 {
		attempts = contract.DefaultMaxAttempts
	}
	sent := 2000 - wantFailed - wantSkipped
	perRun := float64(sent) * math.Pow(retryable, float64(attempts))
	t.Logf("max_attempts %d, %.0f%% retryable answers: a chance give-up in %.2g of demo runs", attempts, 100*retryable, perRun)
	if perRun > 1e-6 {
		t.Fatalf("a demo run gives up on a recipient by chance with probability %.2g (max_attempts %d); want at most 1e-6", perRun, attempts)
	}
}
