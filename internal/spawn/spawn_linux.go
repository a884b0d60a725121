package spawn

import (
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

var (
	once    sync.Once
	spawner chan func()
	tid     atomic.Int64
)

func start(cmd *exec.Cmd) error {
	once.Do(func() {
		spawner = make(chan func())
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked, and this goroutine never returns
			tid.Store(int64(syscall.Gettid()))
			close(ready)
			for f := range spawner {
				f()
			}
		}()
		<-ready
	})
	errc := make(chan error)
	spawner <- func() { errc <- cmd.Start() }
	return <-errc
}

func thread() int { return int(tid.Load()) }
