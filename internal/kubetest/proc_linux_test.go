package kubetest

import (
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// A process must outlive the OS thread of the goroutine that started it. Pdeathsig fires
// when the thread that forked the child ends, not when the process does, and Go ends a
// thread whenever a goroutine exits locked to it: jail.StartFiltered does so for every agent
// an in-process intern daemon starts, in the same test binary as the API server (#42).
func TestProcessOutlivesItsThread(t *testing.T) {
	died := make(chan *process, 1)
	started := make(chan *process)
	go func() {
		// Never unlocked: the thread ends with this goroutine. Not the main thread, which
		// the runtime parks rather than ends.
		for {
			runtime.LockOSThread()
			if syscall.Gettid() != os.Getpid() {
				break
			}
			runtime.UnlockOSThread()
			time.Sleep(time.Millisecond)
		}
		p, err := startProcess("sleep", func(p *process) { died <- p }, "/bin/sleep",
			filepath.Join(t.TempDir(), "sleep.log"), "60")
		if err != nil {
			t.Error(err)
		}
		started <- p
	}()
	p := <-started
	if p == nil {
		return
	}
	defer p.kill()
	select {
	case p := <-died:
		t.Fatalf("the child died with the thread that started it: %s", p.describe())
	case <-time.After(time.Second):
	}
}
