package status

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// The fold is split into Config.Partitions partitions by task: a task's
// events are folded by the holder of its partition's lease, from that
// partition's own consumer of EVENTS, so the fold's work (outcome
// arrays, checkpoints, progress writes, the recipient index) spreads over
// the status processes, each taking its fair share of the partitions
// (lease.FairShare). Every partition's consumer is delivered every event
// and skips the other partitions' tasks: EVENTS subjects name the task,
// not a partition, and must not change. Partition 0 also counts every
// event into the accounts' health scores (score.go), which need all of
// them. With one partition (the default) the fold is what it always was:
// consumer "status", lease contract.StatusFoldLease.
//
// All status processes must run with the same count: a process finding
// another count's fold leases in KV broadcast_leases stands by until they
// are gone (foreignLayout).
type partition struct {
	k, n int
	// leaseKey and consumer are the partition's names in KV
	// broadcast_leases and on stream EVENTS.
	leaseKey, consumer string
	// holds is the partition's lease while this process folds it, nil
	// while it stands by; nothing of it is written without it valid.
	holds atomic.Pointer[lease.Lease]
	// changed carries tasks whose run state changed without an event (a
	// pause, a resume); hurry cuts receive's wait short after a failed
	// attempt was folded, so a failing task's breaker reacts as fast as
	// events arrive.
	changed chan string
	hurry   chan struct{}

	// Under Service.mu: the fold states of the partition's tasks, and the
	// recipient index entries folded since it last published (lookup.go).
	folds        map[string]*taskFold
	pendingIndex []indexEntry
}

// maxPartitions bounds Config.Partitions: every partition's consumer is
// delivered every event.
const maxPartitions = contract.MaxStatusPartitions

func newPartitions(n int) []*partition {
	parts := make([]*partition, n)
	for k := range parts {
		p := &partition{k: k, n: n, leaseKey: FoldLeaseKey(k, n), consumer: contract.StatusConsumer(k, n),
			changed: make(chan string, 1024), hurry: make(chan struct{}, 1), folds: map[string]*taskFold{}}
		parts[k] = p
	}
	return parts
}

// FoldLeaseKey is the key in KV broadcast_leases of partition k of n:
// contract.StatusFoldLease with one, status.fold.<k>-of-<n> with more.
func FoldLeaseKey(k, n int) string {
	if n <= 1 {
		return contract.StatusFoldLease
	}
	return fmt.Sprintf("%s.%d-of-%d", contract.StatusFoldLease, k, n)
}

// PartitionOf is the partition of taskID among n: FNV-1a of the id,
// modulo n.
func PartitionOf(taskID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(taskID))
	return int(h.Sum32() % uint32(n))
}

// partFor is the partition folding taskID.
func (s *Service) partFor(taskID string) *partition {
	return s.parts[PartitionOf(taskID, len(s.parts))]
}

// owns reports whether taskID is this partition's.
func (p *partition) owns(taskID string) bool { return PartitionOf(taskID, p.n) == p.k }

// mayWrite reports whether this process may write the partition's
// progress and checkpoints now: it holds a valid lease on it.
func (p *partition) mayWrite() bool {
	l := p.holds.Load()
	return l != nil && l.Valid()
}

// consumerConfig is the partition's consumer of EVENTS, starting after
// start when it is not 0 (see startAfter).
func (p *partition) consumerConfig(start uint64) jetstream.ConsumerConfig {
	cc := consumerConfig()
	cc.Durable = p.consumer
	if p.n > 1 {
		cc.Description = fmt.Sprintf("status: folds the events of partition %d of %d of the tasks into progress", p.k, p.n)
	}
	if start > 0 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start+1
	}
	return cc
}

// openConsumer returns the partition's consumer, creating it when it does
// not exist. A new one starts where the fold of another partition count
// left off (startAfter), not at the beginning of EVENTS: everything below
// the lowest acknowledged sequence is in the checkpoints already.
func (s *Service) openConsumer(ctx context.Context, p *partition) (jetstream.Consumer, error) {
	stream, err := s.js.Stream(ctx, contract.StreamEvents)
	if err != nil {
		return nil, err
	}
	if c, err := stream.Consumer(ctx, p.consumer); err == nil {
		// Update to today's settings, keeping where it started.
		info := c.CachedInfo()
		cc := p.consumerConfig(0)
		cc.DeliverPolicy, cc.OptStartSeq = info.Config.DeliverPolicy, info.Config.OptStartSeq
		if info.Config.AckPolicy != cc.AckPolicy {
			return remakeWithAckPolicy(ctx, stream, info, cc)
		}
		return stream.CreateOrUpdateConsumer(ctx, cc)
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	start, err := startAfter(ctx, stream)
	if err != nil {
		return nil, err
	}
	return stream.CreateOrUpdateConsumer(ctx, p.consumerConfig(start))
}

// remakeWithAckPolicy replaces a fold consumer made with another ack
// policy (before status acknowledged once per flush), which the server
// cannot change in place, by one with cc's that starts after the old
// one's acknowledgement floor: everything up to it is in the checkpoints,
// and what follows is folded again, idempotently.
func remakeWithAckPolicy(ctx context.Context, stream jetstream.Stream, old *jetstream.ConsumerInfo, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if floor := old.AckFloor.Stream; floor > 0 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, max(floor+1, old.Config.OptStartSeq)
	}
	if err := stream.DeleteConsumer(ctx, old.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	c, err := stream.CreateOrUpdateConsumer(ctx, cc)
	if err != nil {
		// Another status process starting beside this one remade it first
		// (its start may differ, which an update cannot change).
		if again, aerr := stream.Consumer(ctx, old.Name); aerr == nil && again.CachedInfo().Config.AckPolicy == cc.AckPolicy {
			return again, nil
		}
	}
	return c, err
}

// remakeIfRemoved makes p's consumer again when a failed pull was
// because it is gone from EVENTS (an operator removed it, or the sweep of
// another partition count's consumers did while this process stood by),
// starting after the fold consumers still there (openConsumer). Without
// it the fold would stop for good. It reports whether it did; cons, a
// handle by name, pulls from the new consumer.
func (s *Service) remakeIfRemoved(ctx context.Context, p *partition, cons jetstream.Consumer) bool {
	ictx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	if _, err := cons.Info(ictx); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false
	}
	if _, err := s.openConsumer(ictx, p); err != nil {
		s.log.Warn("the fold consumer is gone from EVENTS and cannot be made again; retrying", "consumer", p.consumer, "err", err)
		return false
	}
	s.log.Warn("the fold consumer was gone from EVENTS; made it again", "consumer", p.consumer)
	return true
}

// startAfter is the lowest acknowledged sequence over the fold consumers
// on EVENTS (of another partition count, or this count's partitions made
// just before: a consumer that started after a sequence reports it as
// acknowledged), 0 when there are none.
func startAfter(ctx context.Context, stream jetstream.Stream) (uint64, error) {
	var floor uint64
	found := false
	names := stream.ConsumerNames(ctx)
	for name := range names.Name() {
		if name != contract.ConsumerStatus && !strings.HasPrefix(name, contract.ConsumerStatus+"-") {
			continue
		}
		c, err := stream.Consumer(ctx, name)
		if err != nil {
			continue
		}
		if seq := c.CachedInfo().AckFloor.Stream; !found || seq < floor {
			floor, found = seq, true
		}
	}
	return floor, names.Err()
}

// foreignLayout names a fold lease of another partition count held now,
// "" when there is none: two counts would fold one task twice.
func (s *Service) foreignLayout(ctx context.Context) (string, error) {
	lctx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	keys, err := s.leases.ListKeysFiltered(lctx, contract.StatusFoldLease, contract.StatusFoldLease+".>")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer func() { _ = keys.Stop() }()
	mine := map[string]bool{}
	for _, p := range s.parts {
		mine[p.leaseKey] = true
	}
	for key := range keys.Keys() {
		if !mine[key] {
			return key, nil
		}
	}
	return "", nil
}

// shareCheck is how often a folding partition asks whether this process
// holds more than its share.
const shareCheck = 2 * time.Second
