package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/cohort-dev/cohort/internal/spawn"
)

// sysProcAttr puts a child in its own process group (so killGroup reaches what it spawned)
// and has the kernel kill it if the test binary dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// start starts cmd from spawn's thread, which never ends (Pdeathsig fires when the thread
// that forked a child ends: #42), and returns that thread.
func start(cmd *exec.Cmd) (tid int, err error) {
	err = spawn.Start(cmd)
	return spawn.Thread(), err
}

// threadAlive reports whether thread tid of this process still runs.
func threadAlive(tid int) bool {
	_, err := os.Stat(filepath.Join("/proc/self/task", strconv.Itoa(tid)))
	return err == nil
}

// maxRSS is the process's peak resident memory.
func maxRSS(ps *os.ProcessState) string {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return fmt.Sprintf("%d MiB", ru.Maxrss/1024)
	}
	return "?"
}

func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }

// lockIP claims ip across processes: test binaries of several packages run at once and
// each numbers its Pods' addresses from 127.0.0.10. The lock dies with the process.
func lockIP(ip string) (*os.File, bool) {
	dir := filepath.Join(os.TempDir(), "cohort-kubetest-ips")
	os.MkdirAll(dir, 0o777)
	f, err := os.OpenFile(filepath.Join(dir, ip), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// exitCode reports a signal's death as a container runtime does: 128+signal (137 for SIGKILL).
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
