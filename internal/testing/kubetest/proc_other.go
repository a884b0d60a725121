//go:build !linux

package kubetest

import (
	"os"
	"os/exec"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func start(cmd *exec.Cmd) (tid int, err error) { return 0, cmd.Start() }

func threadAlive(int) bool { return true }

func maxRSS(*os.ProcessState) string { return "?" }

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
