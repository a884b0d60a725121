package kubetest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
		p, err := startProcess("sleep", "/bin/sleep", filepath.Join(t.TempDir(), "sleep.log"), "60")
		if err != nil {
			t.Error(err)
		} else {
			p.watch(func(p *process) { died <- p })
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

// A process that exits on its own is reported with its exit status and log; one killed by
// the harness is not.
func TestProcessDeathReported(t *testing.T) {
	dir := t.TempDir()
	died := make(chan *process, 2)
	p, err := startProcess("quitter", "/bin/sh", filepath.Join(dir, "quitter.log"), "-c", "echo going away; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	p.watch(func(p *process) { died <- p })
	select {
	case p := <-died:
		if s := p.describe(); !strings.Contains(s, "exit status 3") {
			t.Errorf("describe: %s", s)
		}
		if s := tail(p.logPath, 30); s != "going away" {
			t.Errorf("log tail: %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exit was not reported")
	}
	q, err := startProcess("sleeper", "/bin/sleep", filepath.Join(dir, "sleeper.log"), "60")
	if err != nil {
		t.Fatal(err)
	}
	q.watch(func(p *process) { died <- p })
	q.kill()
	select {
	case p := <-died:
		t.Errorf("a kill by the harness was reported: %s", p.describe())
	default:
	}
}
