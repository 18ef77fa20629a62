package shared

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// Recover, deferred directly (defer shared.Recover(log, "what", nil)),
// stops a panic from killing the process: it logs the panic with its stack
// at error level and, when there was one, calls then (to hand work back,
// end a session, ...). A goroutine without it takes the whole service down
// on a panic, and with it every replica that picks up the same input.
func Recover(log *slog.Logger, what string, then func(p any)) {
	p := recover()
	if p == nil {
		return
	}
	log.Error("PANIC recovered: "+what+" survives; please report it", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if then != nil {
		then(p)
	}
}

// SupervisePause is how long Supervise waits before running a function
// that panicked again, so a panic on every run does not spin.
const SupervisePause = time.Second

// Supervise runs fn until it returns; when it panics, the panic is logged
// (Recover) and fn runs again after SupervisePause, until ctx ends. For the
// long-running loops of a service (watchers, tickers, sweepers).
func Supervise(ctx context.Context, log *slog.Logger, what string, fn func(context.Context)) {
	for {
		panicked := false
		func() {
			defer Recover(log, what, func(any) { panicked = true })
			fn(ctx)
		}()
		if !panicked {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(SupervisePause):
		}
	}
}

// PanicError is the error a recovered panic becomes where work must be
// retried.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return "panic: " + fmt.Sprint(e.Value) }
