package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
)

// sysProcAttr puts a child in its own process group (so killGroup reaches what it spawned)
// and has the kernel kill it if the test binary dies without running its cleanups.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// start starts cmd from the spawner's thread, and returns that thread.
//
// The kernel sends a child its Pdeathsig when the thread that forked it ends, not when the
// process does; and the Go runtime ends a thread whenever a goroutine exits locked to it,
// as jail.StartFiltered's do for every agent an in-process intern daemon starts. A child
// forked from an ordinary goroutine's thread was SIGKILLed whenever that thread happened to
// be the one taken and ended (#42: the API server of the conformance suite, mid-test).
// The spawner's thread never ends, so Pdeathsig means what it should: the test binary died.
func start(cmd *exec.Cmd) (tid int, err error) {
	spawnerOnce.Do(func() {
		spawner = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked, and this goroutine never returns
			for f := range spawner {
				f()
			}
		}()
	})
	done := make(chan struct{})
	spawner <- func() {
		tid, err = syscall.Gettid(), cmd.Start()
		close(done)
	}
	<-done
	return tid, err
}

var (
	spawnerOnce sync.Once
	spawner     chan func()
)

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
