//go:build !linux

package kubetest

import (
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

func lockIP(ip string) (*os.File, bool) { return nil, true }

func exitCode(ps *os.ProcessState) int {
	if c := ps.ExitCode(); c >= 0 {
		return c
	}
	return 137
}
