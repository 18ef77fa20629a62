package contract

import "strings"

// Render announces the accounts of a batch's jobs on SubjectWake before it
// stores them (core NATS, no stream): the account names, a line each, in
// notices of at most MaxWakeNotice bytes. Dispatch wakes those of its
// sleeping accounts at once, so their leases and lanes are ready when the
// jobs are stored instead of at the lane finder's next look. A notice lost
// costs only that wait, and one whose jobs never come only a session that
// idles out. Internal: not part of the contract.
const SubjectWake = "broadcast.wake"

// MaxWakeNotice bounds a wake notice's size (the server's default payload
// limit is 1 MiB).
const MaxWakeNotice = 64 << 10

// WakeNotices encodes accounts as wake notices.
func WakeNotices(accounts []string) [][]byte {
	var out [][]byte
	var b []byte
	for _, a := range accounts {
		if len(b) > 0 && len(b)+1+len(a) > MaxWakeNotice {
			out, b = append(out, b), nil
		}
		if len(b) > 0 {
			b = append(b, '\n')
		}
		b = append(b, a...)
	}
	if len(b) > 0 {
		out = append(out, b)
	}
	return out
}

// WakeNoticeAccounts calls fn with each account name a wake notice lists.
func WakeNoticeAccounts(notice []byte, fn func(account string)) {
	for line := range strings.SplitSeq(string(notice), "\n") {
		if line != "" {
			fn(line)
		}
	}
}
