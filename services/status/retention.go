package status

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// forget removes, every so often until ctx ends, the progress value and
// the checkpoint of each task that finished more than Config.Retention
// ago, so months of tasks do not pile up in KV and the object store.
func (s *Service) forget(ctx context.Context) {
	every := min(time.Hour, s.cfg.Retention/4)
	shared.Every(ctx, every, func(ctx context.Context) {
		if !s.mayWriteShared() {
			return // the folding process removes them
		}
		n, err := s.forgetFinished(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			s.log.Warn("removing old finished tasks failed; next round tries again", "err", err)
		}
		if n > 0 {
			s.log.Info("old finished tasks removed", "count", n, "retention", s.cfg.Retention)
		}
	})
}

// forgetFinished removes what is kept of tasks finished before now minus
// the retention and returns how many it removed.
func (s *Service) forgetFinished(ctx context.Context, now time.Time) (int, error) {
	keys, err := s.progress.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer func() { _ = keys.Stop() }()
	var old []string
	for id := range keys.Keys() {
		e, err := s.progress.Get(ctx, id)
		if err != nil {
			continue
		}
		var p contract.Progress
		if json.Unmarshal(e.Value(), &p) != nil || !p.State.Final() || p.FinishedAt == nil {
			continue
		}
		if now.Sub(*p.FinishedAt) > s.cfg.Retention {
			old = append(old, id)
		}
	}
	for i, id := range old {
		s.mu.Lock()
		live := s.partFor(id).folds[id] != nil // reopened meanwhile (retry-dead)
		s.mu.Unlock()
		if live {
			continue
		}
		if err := s.checkpoints.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return i, err
		}
		if err := s.progress.Purge(ctx, id); err != nil {
			return i, err
		}
	}
	return len(old), nil
}
