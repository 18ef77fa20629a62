package render

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// A batch's jobs go out as job groups (contract.SplitJobs): up to
// Config.JobsPerMessage jobs of one account in a message, so the stream
// stores, delivers, acknowledges and removes one message for all of them.
// A job's account is still picked for its recipient (shared.Picker), so
// a recipient keeps its account; the jobs of each account are grouped in
// the order of the batch.
//
// Deduplication must not depend on the grouping: a batch rendered twice (a
// redelivery after a crash, a resumed expansion) must not enqueue a job in
// two messages, since dispatch sends a job on its first delivery without a
// lookup. The accounts picked can differ the second time (health weights),
// so the grouping is recorded in KV broadcast_groupings before any job of
// the batch is published, and a batch rendered again publishes each
// recorded group under the same Nats-Msg-Id (contract.GroupMsgID), to the
// account recorded, which the stream's duplicate window drops.

// renderedJob is a job rendered and encoded, waiting to be published.
type renderedJob struct {
	pos      int // offset in the batch
	account  string
	priority contract.Priority
	msgID    string // the job's Nats-Msg-Id when it goes alone
	data     []byte
}

// recordedAccounts returns the account recorded for each position of a
// batch of n recipients ("" where none is), from g (nil: none recorded).
func recordedAccounts(g *contract.Grouping, n int) []string {
	if g == nil {
		return nil
	}
	accounts := make([]string, n)
	for _, grp := range g.Groups {
		for _, p := range grp.Positions {
			if p >= 0 && p < n {
				accounts[p] = grp.Account
			}
		}
	}
	return accounts
}

// readGrouping returns the grouping recorded under key, nil when none is.
func (s *Service) readGrouping(ctx context.Context, key string) (*contract.Grouping, error) {
	e, err := s.groupings.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("grouping: %w", err)
	}
	var g contract.Grouping
	if err := json.Unmarshal(e.Value(), &g); err != nil {
		// Unreadable: grouping afresh can only repeat what the duplicate
		// window would have dropped, and the batch's jobs are checked
		// before sending (Job.Recheck), so it is not a reason to stop.
		s.log.Warn("recorded grouping does not decode; grouping the batch afresh", "key", key, "err", err)
		return nil, nil
	}
	return &g, nil
}

// groupJobs lays jobs (in batch order) out in groups of up to size jobs of
// one account, each group's encoding at most maxBytes. An account's n jobs
// of the batch are split evenly over ceil(n/size) groups (17 jobs at 24 a
// group make one message, 25 make two of 13 and 12), so a batch's share of
// an account a little over a round number does not leave a message of one
// or two jobs behind. Groups of one job are left out: such a job goes
// alone, under its own id.
func groupJobs(jobs []renderedJob, size, maxBytes int) *contract.Grouping {
	type open struct {
		group *contract.JobGroup
		bytes int
		// target is this group's size in the even split; left and groups
		// are the account's jobs not yet placed and its groups still to
		// open, this one included.
		target, left, groups int
	}
	perAccount := map[string]int{}
	for _, j := range jobs {
		perAccount[j.account]++
	}
	var groups []*contract.JobGroup
	byAccount := map[string]*open{}
	for _, j := range jobs {
		o := byAccount[j.account]
		if o == nil || len(o.group.Positions) >= o.target || o.bytes+len(j.data)+1 > maxBytes {
			next := &open{group: &contract.JobGroup{Account: j.account}}
			if o == nil {
				n := perAccount[j.account]
				next.left, next.groups = n, (n+size-1)/size
			} else {
				next.left, next.groups = o.left, max(o.groups-1, 1)
			}
			// Even sizes over the groups left: the first ones take the
			// remainder, one job each.
			next.target = min((next.left+next.groups-1)/next.groups, size)
			o = next
			byAccount[j.account] = o
			groups = append(groups, o.group)
		}
		o.group.Positions = append(o.group.Positions, j.pos)
		o.bytes += len(j.data) + 1
		o.left--
	}
	g := &contract.Grouping{Groups: []contract.JobGroup{}}
	for _, grp := range groups {
		if len(grp.Positions) > 1 {
			g.Groups = append(g.Groups, *grp)
		}
	}
	return g
}

// errGroupedBefore sends a batch whose grouping another rendering recorded
// first back to be rendered again with it (its redelivery reads it).
var errGroupedBefore = errors.New("the batch was grouped by an earlier rendering; rendering it again with that grouping")

// publishGrouped publishes jobs (in batch order) as the groups of g, or
// of a new grouping recorded under key when g is nil, and every job in no
// group alone.
func (s *Service) publishGrouped(ctx context.Context, key string, g *contract.Grouping, jobs []renderedJob, taskID string, batchFirst int, test bool, futures *[]*shared.Publication) error {
	maxPayload := int(s.js.Conn().MaxPayload()) - jobHeaderBytes
	if g == nil {
		g = groupJobs(jobs, s.cfg.JobsPerMessage, maxPayload/4)
		data, err := json.Marshal(g)
		if err != nil {
			return err
		}
		if _, err := s.groupings.Create(ctx, key, data); errors.Is(err, jetstream.ErrKeyExists) {
			return shared.RetryAfter(0, errGroupedBefore)
		} else if err != nil {
			return fmt.Errorf("recording the grouping: %w", err)
		}
	}
	byPos := make(map[int]*renderedJob, len(jobs))
	for i := range jobs {
		byPos[jobs[i].pos] = &jobs[i]
	}
	for _, grp := range g.Groups {
		var members []*renderedJob
		size := 0
		for _, p := range grp.Positions {
			if j := byPos[p]; j != nil { // nil: not rendered this time (skipped since)
				members = append(members, j)
				size += len(j.data) + 1
			}
		}
		if len(members) == 0 {
			continue
		}
		if size > maxPayload {
			// Rendered again larger than it was (another account's
			// escaping): its jobs go alone; they are rechecked before
			// sending (Job.Recheck), as every job of a batch rendered again.
			s.log.Warn("a recorded job group no longer fits a message; its jobs go alone", "task", taskID, "first", batchFirst)
			continue
		}
		parts := make([][]byte, len(members))
		for i, j := range members {
			parts[i] = j.data
			delete(byPos, j.pos)
		}
		first := members[0]
		id := contract.GroupMsgID(contract.JobID(taskID, batchFirst+grp.Positions[0], test), len(grp.Positions))
		f, err := s.pub.Publish(ctx, contract.JobSubject(grp.Account, first.priority), contract.JoinJobs(parts), id)
		if err != nil {
			return err
		}
		*futures = append(*futures, f)
	}
	for i := range jobs {
		if j := byPos[jobs[i].pos]; j != nil {
			f, err := s.pub.Publish(ctx, contract.JobSubject(j.account, j.priority), j.data, j.msgID)
			if err != nil {
				return err
			}
			*futures = append(*futures, f)
		}
	}
	return nil
}
