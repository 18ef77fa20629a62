//go:build !unix

package proctest

import (
	"os"
	"os/exec"
	"syscall"
)

var (
	sigKill = os.Kill
	sigTerm = os.Interrupt
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup signals the process only: there are no process groups here.
func signalGroup(cmd *exec.Cmd, sig os.Signal) error { return cmd.Process.Signal(sig) }

// lockFile does nothing here: concurrent builds rely on the rename alone.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
