package dispatch

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// poolCache keeps the accounts lists of tasks whose jobs refer to them
// (Job.PoolInTask). A task's accounts never change once it is accepted, so
// an entry stays until the cache is full.
type poolCache struct {
	mu    sync.Mutex
	pools map[string][]string
}

const maxCachedPools = 1024

// poolOf returns the accounts job may move to: its own Pool, or, for a
// task naming more than contract.MaxJobPool accounts, the task's list
// from KV broadcast_tasks. When that record cannot be read the job stays
// with its account (a pool of one), never spreading beyond what the task
// named.
func (s *Service) poolOf(ctx context.Context, job *contract.Job) []string {
	if !job.PoolInTask {
		return job.Pool
	}
	s.pools.mu.Lock()
	pool, ok := s.pools.pools[job.TaskID]
	s.pools.mu.Unlock()
	if ok {
		return pool
	}
	e, err := s.tasks.Get(ctx, job.TaskID)
	var rec contract.TaskRecord
	if err == nil {
		err = json.Unmarshal(e.Value(), &rec)
	}
	if err != nil || len(rec.Task.Accounts) == 0 {
		s.log.Warn("cannot read the task's accounts; the job stays with its account", shared.KeyTaskID, job.TaskID, "err", err)
		return []string{job.Account}
	}
	s.pools.mu.Lock()
	if s.pools.pools == nil || len(s.pools.pools) >= maxCachedPools {
		s.pools.pools = map[string][]string{}
	}
	s.pools.pools[job.TaskID] = rec.Task.Accounts
	s.pools.mu.Unlock()
	return rec.Task.Accounts
}
