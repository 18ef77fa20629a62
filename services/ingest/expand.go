package ingest

import (
	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/shared"
)

// expansion is a task's recipient list after dedup, in submission order.
type expansion struct {
	recipients []shared.BatchRecipient
	duplicates int
}

// expand normalises each recipient for the channel and drops repeats (by
// normalised address). Invalid addresses are kept, marked, so render skips
// them with the reason and they count in total: the user sent them.
func expand(ch channels.Channel, rs []shared.Recipient) expansion {
	var out expansion
	seen := make(map[string]struct{}, len(rs))
	out.recipients = make([]shared.BatchRecipient, 0, len(rs))
	for _, r := range rs {
		br := shared.BatchRecipient{To: r.To, Vars: r.Vars}
		key := r.To
		if to, err := ch.NormalizeRecipient(r.To); err != nil {
			br.Invalid = "to: " + err.Error()
		} else {
			br.To, key = to, to
			if why := shared.CheckVars(r.Vars); why != "" {
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
// alone is never over it (its vars are bounded by shared.MaxVarsBytes).
func batches(taskID string, rs []shared.BatchRecipient, size, maxBytes int, test bool) []shared.RenderBatch {
	var out []shared.RenderBatch
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
		out = append(out, shared.RenderBatch{TaskID: taskID, First: first, Recipients: rs[first:end], Test: test})
		first = end
	}
	return out
}
