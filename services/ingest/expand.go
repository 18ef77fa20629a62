package ingest

import (
	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// expansion is a task's recipient list after dedup, in submission order.
type expansion struct {
	recipients []contract.BatchRecipient
	duplicates int
}

// expand normalises each recipient for the channel and drops repeats (by
// normalised address). Invalid addresses are kept, marked, so render skips
// them with the reason and they count in total: the user sent them.
func expand(ch channels.Channel, rs []contract.Recipient) expansion {
	var out expansion
	seen := make(map[string]struct{}, len(rs))
	out.recipients = make([]contract.BatchRecipient, 0, len(rs))
	for _, r := range rs {
		br := contract.BatchRecipient{To: r.To, Vars: r.Vars}
		key := r.To
		if to, err := ch.NormalizeRecipient(r.To); err != nil {
			br.Invalid = "to: " + err.Error()
		} else {
			br.To, key = to, to
			if why := contract.CheckVars(r.Vars); why != "" {
				br.Invalid, br.Vars = why, nil
			}
		}
		if _, dup := seen[key]; dup {
			out.duplicates++
			continue
		}
		seen[key] = struct{}{}
		out.recipients = append(out.recipients, br)
	}
	return out
}

// jobsPerAccountInBatch is how many recipients per account of a task's
// pool a render batch holds at least: render groups each account's jobs
// of a batch into messages of up to 24 (contract.DefaultJobGroupSize), and a
// batch of 500 over 1,000 accounts gave every job a message of its own,
// which JetStream stores, delivers, acknowledges and removes one by one,
// checking every consumer of JOBS on each acknowledgement.
const jobsPerAccountInBatch = 16

// maxBatchRecipients bounds a render batch however many accounts a task
// has: 16 an account up to 1,000 accounts (fewer jobs a message cost
// the server an interest check over every lane consumer per message,
// docs/performance.md), and render's grouping record for a batch (a
// position per recipient, KV broadcast_groupings) stays near 150 KB.
const maxBatchRecipients = 16_000

// batchSizeFor is how many recipients each of task's render batches
// holds (BatchSizeFor over the accounts it names, else those of its
// channel).
func (s *Service) batchSizeFor(task *contract.Task) int {
	accounts := len(task.Accounts)
	if accounts == 0 {
		for _, a := range s.accounts.All() {
			if a.Channel == task.Channel {
				accounts++
			}
		}
	}
	return BatchSizeFor(s.cfg.BatchSize, accounts)
}

// BatchSizeFor is how many recipients each render batch of a task over
// pool accounts holds: the configured size, or 16 per account when that
// is more, up to 16,000 (so 16 an account up to 1,000 accounts).
func BatchSizeFor(configured, pool int) int {
	return max(configured, min(jobsPerAccountInBatch*pool, maxBatchRecipients))
}

// batchSize is the batch size rec fixed (batchSizeFor at acceptance).
func (s *Service) batchSize(rec *contract.TaskRecord) int {
	if rec.BatchSize > 0 {
		return rec.BatchSize
	}
	return s.cfg.BatchSize
}

// batches cuts rs into render batches of at most size recipients and
// about maxBytes bytes, so each fits the server's max_payload; a recipient
// alone is never over it (its vars are bounded by contract.MaxVarsBytes).
func batches(taskID string, rs []contract.BatchRecipient, size, maxBytes int, test bool) []contract.RenderBatch {
	var out []contract.RenderBatch
	for first := 0; first < len(rs); {
		end, bytes := first, 0
		for end < len(rs) && end-first < size {
			n := rs[end].BatchBytes()
			if end > first && bytes+n > maxBytes {
				break
			}
			bytes += n
			end++
		}
		out = append(out, contract.RenderBatch{TaskID: taskID, First: first, Recipients: rs[first:end], Test: test})
		first = end
	}
	return out
}
