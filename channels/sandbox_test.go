package channels

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func sandboxMsgs(tos ...string) []Message {
	msgs := make([]Message, len(tos))
	for i, to := range tos {
		msgs[i] = Message{ID: fmt.Sprintf("t.%d", i), TaskID: "t", To: to, Body: "same"}
	}
	return msgs
}

// TestSandboxBatchIsOneCall checks that a multi-message Send is one
// simulated call with per-recipient answers, and that Stats counts it.
func TestSandboxBatchIsOneCall(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		extra string
		want  []Result // per message, Err and RetryAfter ignored
	}{
		{name: "accepted", want: []Result{{ProviderID: "sbx-t.0"}, {Class: contract.ClassPermanent, Code: "400"}, {ProviderID: "sbx-t.2"}, {Class: contract.ClassAccountFatal, Code: "401"}}},
		{name: "call fails", extra: `,"fail_rate":1`, want: []Result{{Class: contract.ClassRetryable, Code: "503"}, {Class: contract.ClassPermanent, Code: "400"}, {Class: contract.ClassRetryable, Code: "503"}, {Class: contract.ClassAccountFatal, Code: "401"}}},
		{name: "call rate limited", extra: `,"rate_limited_rate":1,"retry_after":"3s"`, want: []Result{{Class: contract.ClassRateLimited, Code: "429"}, {Class: contract.ClassPermanent, Code: "400"}, {Class: contract.ClassRateLimited, Code: "429"}, {Class: contract.ClassAccountFatal, Code: "401"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stats := &SandboxStats{}
			acct := testAccount(t, `{"channel":"sandbox","max_batch":10,"latency":"20ms","permanent_prefix":"bad-","fatal_prefix":"revoked-"`+tt.extra+`}`)
			s, err := Sandbox{Stats: stats}.NewSender(acct, nil)
			require.NoError(t, err)
			start := time.Now()
			got := s.Send(context.Background(), sandboxMsgs("a", "bad-b", "c", "revoked-d"))
			require.Less(t, time.Since(start), 200*time.Millisecond, "latency is paid once per call, not per message")
			require.Len(t, got, len(tt.want))
			for i, w := range tt.want {
				require.Equal(t, w.Class, got[i].Class, "message %d", i)
				require.Equal(t, w.Code, got[i].Code, "message %d", i)
				require.Equal(t, w.ProviderID, got[i].ProviderID, "message %d", i)
				if w.Class == contract.ClassRateLimited {
					require.Equal(t, 3*time.Second, got[i].RetryAfter)
				}
			}
			require.EqualValues(t, 1, stats.Calls.Load())
			require.EqualValues(t, 4, stats.Messages.Load())
		})
	}
}

// TestSandboxCallDrawIsShared checks that one draw decides the whole call:
// with fail_rate 0.5 every call's non-prefixed messages answer alike.
func TestSandboxCallDrawIsShared(t *testing.T) {
	t.Parallel()
	s, err := Sandbox{}.NewSender(testAccount(t, `{"channel":"sandbox","max_batch":50,"fail_rate":0.5}`), nil)
	require.NoError(t, err)
	tos := make([]string, 50)
	for i := range tos {
		tos[i] = fmt.Sprint("r", i)
	}
	var failedCalls int
	for range 40 {
		got := s.Send(context.Background(), sandboxMsgs(tos...))
		for _, r := range got[1:] {
			require.Equal(t, got[0].Class, r.Class)
		}
		if !got[0].OK() {
			failedCalls++
		}
	}
	// 40 calls at 0.5: outside 5..35 has probability below 1e-6.
	require.Greater(t, failedCalls, 5)
	require.Less(t, failedCalls, 35)
}
