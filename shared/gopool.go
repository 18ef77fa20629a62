package shared

import (
	"context"
	"time"
)

// GoPool runs functions on goroutines it keeps after each, for the next:
// a goroutine whose work grows its stack (a JSON decoder, a channel's send
// path: tens of KB) grows and copies it once, not once per function, as
// a goroutine per function did (a twentieth of dispatch's CPU per job).
// There is no bound: a function that finds no goroutine waiting gets a new
// one. A goroutine waits idle for more work, then ends; all of them end
// once ctx has ended and they are idle.
type GoPool struct {
	ctx  context.Context
	idle time.Duration
	work chan func()
}

// NewGoPool returns a pool whose goroutines wait idle for at most idle.
func NewGoPool(ctx context.Context, idle time.Duration) *GoPool {
	return &GoPool{ctx: ctx, idle: idle, work: make(chan func())}
}

// Go runs f on a waiting goroutine, or on a new one (always a new one on
// a nil pool).
func (p *GoPool) Go(f func()) {
	if p == nil {
		go f()
		return
	}
	select {
	case p.work <- f:
	default:
		go p.run(f)
	}
}

func (p *GoPool) run(f func()) {
	f()
	idle := time.NewTimer(p.idle)
	defer idle.Stop()
	for {
		select {
		case f := <-p.work:
			f()
			idle.Reset(p.idle)
		case <-idle.C:
			return
		case <-p.ctx.Done():
			return
		}
	}
}
