package contract

import (
	"bytes"
	"strconv"
)

// A job message carries one job, or several jobs of one account and
// priority from one render batch, one encoding a line (a job group):
// stored, delivered, acknowledged and removed once for all of them. JSON
// escapes newlines inside strings, so a job's encoding never holds one, and
// a message of one job is the same bytes either way.

// DefaultJobGroupSize is how many jobs a job group holds at most unless
// render is told otherwise (RENDER_JOBS_PER_MESSAGE). It is above the 16
// recipients an account a render batch gives a task over many accounts
// plus the tenth the balancer lets an account take beyond its share, so
// such a batch makes one message per account.
const DefaultJobGroupSize = 24

// HeaderCopyOf names, on a job message dispatch published in place of
// another (a job moved to another account, a retry scheduled for later),
// the Nats-Msg-Id of the record of that hand-off in the job's ledger. The
// first delivery carrying it claims the record, so two messages of one
// copy, however they came, send once. Schedules keep it when they fire.
const HeaderCopyOf = "Broadcast-Copy"

// SplitJobs returns the jobs' encodings in a job message, in order.
// Empty lines are skipped; a message with no line at all yields its data
// as one (undecodable) job, so nothing delivered goes unaccounted.
func SplitJobs(data []byte) [][]byte {
	if bytes.IndexByte(data, '\n') < 0 {
		return [][]byte{data}
	}
	var jobs [][]byte
	for rest := data; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		if len(bytes.TrimSpace(line)) > 0 {
			jobs = append(jobs, line)
		}
	}
	if len(jobs) == 0 {
		return [][]byte{data}
	}
	return jobs
}

// JoinJobs makes one message of jobs' encodings.
func JoinJobs(encoded [][]byte) []byte {
	return bytes.Join(encoded, []byte{'\n'})
}

// GroupMsgID is the Nats-Msg-Id of a job group: the id of the group's
// first job as render recorded it and the group's size as recorded, so a
// batch rendered again (a redelivery, a resumed expansion) publishes each
// recorded group under the same id and the stream's duplicate window drops
// it, even when some of its jobs are not rendered again (suppressed since).
// A job's own id has no '+'.
func GroupMsgID(firstJobID string, size int) string {
	return firstJobID + "+" + strconv.Itoa(size)
}

// GroupingKey is the key in KV broadcast_groupings of how render grouped
// the batch of task that begins at index first.
func GroupingKey(taskID string, first int, test bool) string {
	if test {
		return taskID + ".t" + strconv.Itoa(first)
	}
	return taskID + "." + strconv.Itoa(first)
}

// Grouping is how render laid a batch's jobs out in messages: each group
// one message, to Account, of the jobs at the batch positions listed
// (offsets from the batch's first index). Positions in no group (skipped
// when it was recorded) are published alone.
type Grouping struct {
	Groups []JobGroup `json:"groups"`
}

// JobGroup is one message of a Grouping.
type JobGroup struct {
	Account   string `json:"account"`
	Positions []int  `json:"positions"`
}
