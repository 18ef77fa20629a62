package natstest

import (
	"fmt"
	"strings"
	"sync"
)

// ServerLog collects a server's log lines; it implements server.Logger.
type ServerLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ServerLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
}

// Noticef implements server.Logger (notices are not kept).
func (l *ServerLog) Noticef(string, ...any) {}

// Warnf implements server.Logger.
func (l *ServerLog) Warnf(format string, v ...any) { l.add("[WRN]", format, v...) }

// Fatalf implements server.Logger.
func (l *ServerLog) Fatalf(format string, v ...any) { l.add("[FTL]", format, v...) }

// Errorf implements server.Logger.
func (l *ServerLog) Errorf(format string, v ...any) { l.add("[ERR]", format, v...) }

// Debugf implements server.Logger (debug lines are not kept).
func (l *ServerLog) Debugf(string, ...any) {}

// Tracef implements server.Logger (trace lines are not kept).
func (l *ServerLog) Tracef(string, ...any) {}

// Violations returns the permission and authorization violations logged so
// far, e.g. `[ERR] 127.0.0.1:5555 - cid:9 - "v1.55.0:go:broadcast-ingest" - "ingest" - Publish Violation - Subject "broadcast.jobs.x"`.
func (l *ServerLog) Violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, "Violation") {
			out = append(out, line)
		}
	}
	return out
}

// Lines returns every kept line.
func (l *ServerLog) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}
