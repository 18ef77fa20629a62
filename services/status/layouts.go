package status

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/lease"
)

// Fold consumers of another partition count stay on EVENTS after the
// count changed (STATUS_PARTITIONS), and the server keeps their state and
// offers them every event. The holder of partition 0 removes them once no
// status process of that count folds any more: none holds a fold lease
// of that count. It waits Config.LayoutSweep after taking partition 0
// before it looks, and looks again as often: the partitions of a new
// count whose consumers were removed while they stood by make them again
// at their first pull (remakeIfRemoved), starting after the old count's
// consumers, which must still be there then. A process started later
// with the old count makes its consumers again the same way.

// sweepOtherLayouts removes other counts' fold consumers every
// Config.LayoutSweep until ctx ends.
func (s *Service) sweepOtherLayouts(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(s.cfg.LayoutSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		removed, err := s.removeOtherLayouts(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("cannot remove the fold consumers of another partition count; retrying later", "err", err)
		}
		for _, name := range removed {
			log.Info("removed the fold consumer of another partition count, which no status process folds",
				"consumer", name)
		}
	}
}

// removeOtherLayouts deletes the fold consumers on EVENTS of partition
// counts other than this process's whose fold leases nobody holds, and
// returns their names.
func (s *Service) removeOtherLayouts(ctx context.Context) ([]string, error) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := s.js.Stream(octx, contract.StreamEvents)
	if err != nil {
		return nil, err
	}
	var stale []string
	names := stream.ConsumerNames(octx)
	for name := range names.Name() {
		if n := foldConsumerCount(name); n > 0 && n != len(s.parts) {
			stale = append(stale, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, err
	}
	if len(stale) == 0 {
		return nil, nil
	}
	held, err := s.heldFoldCounts(octx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, name := range stale {
		if held[foldConsumerCount(name)] {
			continue
		}
		if err := stream.DeleteConsumer(octx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return removed, err
		}
		removed = append(removed, name)
	}
	return removed, nil
}

// heldFoldCounts is the set of partition counts whose fold leases someone
// holds now.
func (s *Service) heldFoldCounts(ctx context.Context) (map[int]bool, error) {
	lctx, cancel := context.WithTimeout(ctx, lease.OpTimeout)
	defer cancel()
	keys, err := s.leases.ListKeysFiltered(lctx, contract.StatusFoldLease, contract.StatusFoldLease+".>")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[int]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = keys.Stop() }()
	held := map[int]bool{}
	for key := range keys.Keys() {
		if n := foldLeaseCount(key); n > 0 {
			held[n] = true
		}
	}
	return held, nil
}

// foldConsumerCount is the partition count a consumer on EVENTS folds
// for: 1 for "status", n for "status-<k>-of-<n>", 0 when name is not a
// fold consumer's.
func foldConsumerCount(name string) int { return partitionCount(name, contract.StatusConsumer) }

// foldLeaseCount is the partition count of a fold lease key (FoldLeaseKey),
// 0 when key is not one.
func foldLeaseCount(key string) int { return partitionCount(key, FoldLeaseKey) }

// partitionCount is the n for which name is nameOf(k, n) for some
// partition k, 0 when there is none.
func partitionCount(name string, nameOf func(k, n int) string) int {
	for n := 1; n <= maxPartitions; n++ {
		for k := range n {
			if nameOf(k, n) == name {
				return n
			}
		}
	}
	return 0
}
