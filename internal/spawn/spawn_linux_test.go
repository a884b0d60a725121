package spawn

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// A child with a Pdeathsig outlives the thread of the goroutine that started it, here one
// that exits locked to its thread (which the runtime then ends), as jail.StartFiltered's do.
func TestChildOutlivesTheStartersThread(t *testing.T) {
	for _, how := range []struct {
		name  string
		start func(*exec.Cmd) error
		lives bool
	}{{"Start", Start, true}, {"exec.Cmd.Start (the bug)", (*exec.Cmd).Start, false}} {
		t.Run(how.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			errc := make(chan error)
			go func() {
				// Never unlocked: the thread ends with this goroutine. Not the main thread,
				// which the runtime parks rather than ends.
				for {
					runtime.LockOSThread()
					if syscall.Gettid() != os.Getpid() {
						break
					}
					runtime.UnlockOSThread()
					time.Sleep(time.Millisecond)
				}
				errc <- how.start(cmd)
			}()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			defer func() { cmd.Process.Kill(); <-exited }()
			wait := time.Second
			if !how.lives {
				wait = 10 * time.Second
			}
			select {
			case <-exited:
				if how.lives {
					t.Fatalf("the child died with the thread that started it: %s", cmd.ProcessState)
				}
			case <-time.After(wait):
				if !how.lives {
					t.Fatal("the child lived on: the kernel no longer ties Pdeathsig to the thread? Then this package is moot")
				}
			}
		})
	}
}
