package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// backlogPoll is how often the service reads how many jobs each lane of
// each account has in the jobs stream.
const backlogPoll = 200 * time.Millisecond

// backlog is the service's view of the jobs queued per lane subject
// (broadcast.jobs.<account>.<priority>), refreshed every backlogPoll with
// one stream info request for all accounts: the priority scheduler keeps a
// lower lane waiting while a higher one has jobs queued, not only while
// its handlers are busy (sched.go, setBacklog).
type backlog struct {
	mu     sync.RWMutex
	counts map[string]uint64
}

// queued reports whether subject had jobs in the stream at the last poll
// (delivered but unacknowledged ones included).
func (b *backlog) queued(subject string) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.counts[subject] > 0
}

// run polls the stream until ctx ends.
func (b *backlog) run(ctx context.Context, js jetstream.JetStream) {
	t := time.NewTicker(backlogPoll)
	defer t.Stop()
	for {
		if stream, err := js.Stream(ctx, shared.StreamJobs); err == nil {
			if info, err := stream.Info(ctx, jetstream.WithSubjectFilter(shared.SubjectJobsPrefix+">")); err == nil {
				b.mu.Lock()
				b.counts = info.State.Subjects
				b.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
