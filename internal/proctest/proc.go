package proctest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
var StopTimeout = 15 * time.Second

// ReadyTimeout bounds a Spec's Ready check after each start.
var ReadyTimeout = 30 * time.Second

// FailureTailLines is how many of each process's last log lines are printed
// when a test fails.
var FailureTailLines = 40

// Spec describes a process to run.
type Spec struct {
	// Name labels the process in its log file and in failure output.
	Name string
	// Path is the executable.
	Path string
	// Args are the arguments after the executable's name.
	Args []string
	// Env is added to the test's environment (later entries win).
	Env []string
	// URL and Port are copied to the Proc for callers; proctest does not
	// interpret them.
	URL  string
	Port int
	// Ready, when set, is called after every start and must return nil once
	// the process serves; Start and Restart fail the test if it does not
	// within ReadyTimeout.
	Ready func(ctx context.Context) error
}

// Proc is an OS process run for a test, in its own process group so that
// signals reach its children too. Its stdout and stderr go to a log file in
// t.TempDir() that survives restarts. It is killed when the test ends, and
// when the test failed the tail of its log is printed.
//
// Restart and WaitLog may fail the test and so must be called from the test's
// goroutine; the other methods are safe from any goroutine.
type Proc struct {
	// Name labels the process ("nats", "dispatch", ...).
	Name string
	// URL is where the process serves, when it does: nats://127.0.0.1:PORT
	// for nats-server, http://127.0.0.1:PORT for the gateway.
	URL string
	// Port is the port in URL, or 0.
	Port int
	// LogPath is the file holding the process's output, all starts appended.
	LogPath string

	t    testing.TB
	spec Spec

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when the current cmd has been waited for
	waitErr  error
	starts   int
	logStart int64 // size of the log file when the current start began
}

// Start runs spec until the test ends (or Kill/Stop), waiting for its Ready
// check; it fails the test if the process cannot start or get ready.
func Start(t testing.TB, spec Spec) *Proc {
	t.Helper()
	p, err := start(t, spec)
	if err != nil {
		t.Fatalf("proctest: %v", err)
	}
	return p
}

// start is Start returning the error, so callers can retry with another port.
func start(t testing.TB, spec Spec) (*Proc, error) {
	dir := t.TempDir()
	p := &Proc{
		Name:    spec.Name,
		URL:     spec.URL,
		Port:    spec.Port,
		LogPath: filepath.Join(dir, spec.Name+".log"),
		t:       t,
		spec:    spec,
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("proctest: last %d log lines of %s (%s):\n%s", FailureTailLines, p.Name, p.LogPath, p.Tail(FailureTailLines))
		}
	})
	if err := p.start(); err != nil {
		p.Kill()
		return p, err
	}
	return p, nil
}

func (p *Proc) start() error {
	p.mu.Lock()
	if p.cmd != nil && !closed(p.done) {
		p.mu.Unlock()
		return fmt.Errorf("%s: already running", p.Name)
	}
	p.starts++
	n := p.starts
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s: log file: %w", p.Name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	if fi, err := logFile.Stat(); err == nil {
		p.logStart = fi.Size()
	}
	fmt.Fprintf(logFile, "=== proctest %s: start #%d at %s: %s %s\n", p.Name, n,
		time.Now().Format(time.TimeOnly+".000"), filepath.Base(p.spec.Path), strings.Join(p.spec.Args, " "))

	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.waitErr = cmd, done, nil
	p.mu.Unlock()

	began := time.Now()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		status := "exited normally"
		if err != nil {
			status = err.Error()
		}
		if f, ferr := os.OpenFile(p.LogPath, os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
			fmt.Fprintf(f, "=== proctest %s: #%d %s after %s\n", p.Name, n, status, time.Since(began).Round(time.Millisecond))
			f.Close()
		}
		close(done)
	}()

	if p.spec.Ready == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	for {
		rerr := p.spec.Ready(ctx)
		if rerr == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before it was ready (%v); log:\n%s", p.Name, p.ExitErr(), p.Tail(FailureTailLines))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; log:\n%s", p.Name, ReadyTimeout, rerr, p.Tail(FailureTailLines))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill sends SIGKILL to the process group and waits for the process to exit.
// It does nothing when the process is not running.
func (p *Proc) Kill() {
	cmd, done := p.current()
	if cmd == nil {
		return
	}
	if !closed(done) {
		if err := signalGroup(cmd, sigKill); err != nil && !errors.Is(err, os.ErrProcessDone) {
			p.t.Errorf("proctest: kill %s: %v", p.Name, err)
		}
	}
	<-done
}

// Stop sends SIGTERM to the process group and waits for the process to exit,
// killing it after StopTimeout. It does nothing when the process is not
// running.
func (p *Proc) Stop() {
	cmd, done := p.current()
	if cmd == nil || closed(done) {
		return
	}
	if err := signalGroup(cmd, sigTerm); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("proctest: stop %s: %v", p.Name, err)
	}
	select {
	case <-done:
	case <-time.After(StopTimeout):
		p.t.Errorf("proctest: %s still running %s after SIGTERM; killing it", p.Name, StopTimeout)
		p.Kill()
	}
}

// Restart stops the process if it runs (SIGTERM, see Stop), then starts it
// again with the same arguments, ports and store, and waits for it to be
// ready. It must be called from the test's goroutine.
func (p *Proc) Restart() {
	p.t.Helper()
	p.Stop()
	if err := p.start(); err != nil {
		p.t.Fatalf("proctest: restart: %v", err)
	}
}

// Running reports whether the process is running.
func (p *Proc) Running() bool {
	cmd, done := p.current()
	return cmd != nil && !closed(done)
}

// Pid is the id of the current (or last) process, or 0.
func (p *Proc) Pid() int {
	cmd, _ := p.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

// Starts is how many times the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// ExitErr is the last exit's error from exec.Cmd.Wait (nil while running or
// after a clean exit).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Logs returns the whole log: the output of every start, each preceded by a
// "=== proctest" line and followed by one saying how it ended.
func (p *Proc) Logs() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// CurrentLogs returns the output of the current (or last) start only.
func (p *Proc) CurrentLogs() string {
	p.mu.Lock()
	from := p.logStart
	p.mu.Unlock()
	b, _ := os.ReadFile(p.LogPath)
	if from > int64(len(b)) {
		return ""
	}
	return string(b[from:])
}

// Tail returns the last n lines of the log.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Logs(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitLog waits until the current start's output contains substr, failing
// the test after timeout or if the process exits first. It must be called
// from the test's goroutine.
func (p *Proc) WaitLog(substr string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if strings.Contains(p.CurrentLogs(), substr) {
			return
		}
		if !p.Running() {
			p.t.Fatalf("proctest: %s exited (%v) before logging %q; log:\n%s", p.Name, p.ExitErr(), substr, p.Tail(FailureTailLines))
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("proctest: %s did not log %q within %s; log:\n%s", p.Name, substr, timeout, p.Tail(FailureTailLines))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CountLog counts the occurrences of substr in the whole log.
func (p *Proc) CountLog(substr string) int {
	return strings.Count(p.Logs(), substr)
}

func (p *Proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
