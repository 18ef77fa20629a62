package embedded

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// nodeLog is a cluster node's logger: it passes every line on to next (when
// set) and keeps the first fatal one, which a node that cannot bind a port
// logs before it gives up, so that WaitReady can tell at once rather than
// wait out its timeout.
type nodeLog struct {
	next server.Logger

	mu         sync.Mutex
	firstFatal string
}

// fatal is the first fatal line the node logged, or "".
func (l *nodeLog) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstFatal
}

// Fatalf implements server.Logger.
func (l *nodeLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	if l.firstFatal == "" {
		l.firstFatal = fmt.Sprintf(format, v...)
	}
	l.mu.Unlock()
	if l.next != nil {
		l.next.Fatalf(format, v...)
	}
}

// Noticef implements server.Logger.
func (l *nodeLog) Noticef(format string, v ...any) {
	if l.next != nil {
		l.next.Noticef(format, v...)
	}
}

// Warnf implements server.Logger.
func (l *nodeLog) Warnf(format string, v ...any) {
	if l.next != nil {
		l.next.Warnf(format, v...)
	}
}

// Errorf implements server.Logger.
func (l *nodeLog) Errorf(format string, v ...any) {
	if l.next != nil {
		l.next.Errorf(format, v...)
	}
}

// Debugf implements server.Logger.
func (l *nodeLog) Debugf(format string, v ...any) {
	if l.next != nil {
		l.next.Debugf(format, v...)
	}
}

// Tracef implements server.Logger.
func (l *nodeLog) Tracef(format string, v ...any) {
	if l.next != nil {
		l.next.Tracef(format, v...)
	}
}
