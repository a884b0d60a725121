//go:build !linux

package localjail

import (
	"os"
	"syscall"
)

// sysProcAttr puts a daemon in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// owner is unknown off Linux.
func owner(os.FileInfo) int { return -1 }
