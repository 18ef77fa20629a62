package render

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// spec is what render needs of a task, parsed once per task.
type spec struct {
	task    contract.Task
	tmpl    *contract.Template
	channel channels.Channel
}

// specCache keeps parsed specs of recently rendered tasks.
type specCache struct {
	mu    sync.Mutex
	specs map[string]*spec
}

const maxCachedSpecs = 1024

func (s *Service) spec(ctx context.Context, taskID string) (*spec, error) {
	s.cache.mu.Lock()
	sp := s.cache.specs[taskID]
	s.cache.mu.Unlock()
	if sp != nil {
		return sp, nil
	}
	entry, err := s.tasks.Get(ctx, taskID)
	if err != nil {
		if err == jetstream.ErrKeyNotFound {
			return nil, shared.Permanent(fmt.Errorf("task %s has no record in %s", taskID, contract.BucketTasks))
		}
		return nil, err
	}
	var rec contract.TaskRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return nil, shared.Permanent(fmt.Errorf("task record %s: %w", taskID, err))
	}
	tmpl, err := contract.ParseTemplate(rec.Task.Template)
	if err != nil {
		return nil, shared.Permanent(fmt.Errorf("template: %w", err))
	}
	ch, err := s.cfg.Channels.Get(rec.Task.Channel)
	if err != nil {
		return nil, shared.Permanent(err)
	}
	sp = &spec{task: rec.Task, tmpl: tmpl, channel: ch}
	s.cache.mu.Lock()
	if len(s.cache.specs) >= maxCachedSpecs {
		for k := range s.cache.specs { // drop an arbitrary one
			delete(s.cache.specs, k)
			break
		}
	}
	s.cache.specs[taskID] = sp
	s.cache.mu.Unlock()
	return sp, nil
}
