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
