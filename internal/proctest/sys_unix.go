//go:build unix

package proctest

import (
	"os"
	"os/exec"
	"syscall"
)

var (
	sigKill = syscall.SIGKILL
	sigTerm = syscall.SIGTERM
)

// signalGroup signals the process group the command leads, so children
// the process started get the signal too.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

// lockFile takes an exclusive lock on path, creating it, until unlock.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
