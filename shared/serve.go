package shared

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ConcurrentHandler runs a core subscription's handler on up to limit
// messages at once, so one slow request (a retry-dead re-queueing
// thousands of dead letters) does not hold up the others (a pause) the way
// a subscription's serial callback does. When every slot is busy the
// subscription waits, so the bound also limits the memory of queued work.
type ConcurrentHandler struct {
	slots chan struct{}
	wg    sync.WaitGroup
}

// NewConcurrentHandler allows limit handlers at once (at least 1).
func NewConcurrentHandler(limit int) *ConcurrentHandler {
	return &ConcurrentHandler{slots: make(chan struct{}, max(limit, 1))}
}

// Wrap returns fn run in its own goroutine once a slot is free.
func (c *ConcurrentHandler) Wrap(fn nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		c.slots <- struct{}{}
		c.wg.Add(1)
		go func() {
			defer func() {
				<-c.slots
				c.wg.Done()
			}()
			fn(m)
		}()
	}
}

// Drain drains sub, waits (up to drainWait) until its last message was
// handed over, then until every handler returned.
func (c *ConcurrentHandler) Drain(sub *nats.Subscription) {
	_ = sub.Drain()
	for deadline := time.Now().Add(drainWait); sub.IsValid() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	c.wg.Wait()
}

// drainWait bounds how long Drain waits for the subscription to close.
const drainWait = 5 * time.Second

// KeyedMutex serializes work per key (a task id) while work on different
// keys runs concurrently. The zero value is ready to use.
type KeyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key and returns its unlock function.
func (k *KeyedMutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// Every calls fn every d until ctx ends (the first call after d). The
// periodic housekeeping loops (keeping records alive, forgetting finished
// tasks, reaping deleted accounts) run on it.
func Every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}
