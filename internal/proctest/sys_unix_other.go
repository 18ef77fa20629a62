//go:build unix && !linux

package proctest

import "syscall"

// sysProcAttr puts the process in its own group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
