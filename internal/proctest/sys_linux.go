//go:build linux

package proctest

import "syscall"

// sysProcAttr puts the process in its own group and has the kernel kill it
// if the test binary dies without running its cleanups (a -timeout panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
