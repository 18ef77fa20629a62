//go:build !unix

package scenario

import (
	"os/exec"
	"syscall"
)

func groupAttr() *syscall.SysProcAttr { return nil }

// killGroup kills the process itself: without process groups, hard or not.
func killGroup(cmd *exec.Cmd, _ bool) { _ = cmd.Process.Kill() }
