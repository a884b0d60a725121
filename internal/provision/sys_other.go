//go:build !linux

package provision

import "syscall"

// sysProcAttr puts a daemon in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
