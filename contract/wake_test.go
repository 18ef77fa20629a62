package contract

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWakeNoticesRoundTrip: accounts encoded as notices come back in
// order, each notice within MaxWakeNotice.
func TestWakeNoticesRoundTrip(t *testing.T) {
	var accounts []string
	for i := range 5000 {
		accounts = append(accounts, fmt.Sprintf("account-%040d", i)) // 48 bytes: 5000 of them need four notices
	}
	notices := WakeNotices(accounts)
	require.Len(t, notices, 4)
	var got []string
	for _, n := range notices {
		require.LessOrEqual(t, len(n), MaxWakeNotice)
		WakeNoticeAccounts(n, func(a string) { got = append(got, a) })
	}
	require.Equal(t, accounts, got)
	require.Empty(t, WakeNotices(nil))
	got = nil
	WakeNoticeAccounts([]byte("a\n\nb\n"), func(a string) { got = append(got, a) })
	require.Equal(t, []string{"a", "b"}, got, "empty lines skipped")
}
