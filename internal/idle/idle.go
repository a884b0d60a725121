// Package idle bounds the sessions a process keeps in memory, for the two
// that keep them from files (the intern daemon, internal/internd, and the
// built-in agent, internal/builtinagent): a sweep forgets those unused for a TTL,
// and once there are a quarter more than Max, a trim forgets the least
// recently used down to Max, in the background, one trim at a time. The
// owner does the forgetting (what is in use, and what forgetting releases,
// are its own); Bound decides when (ADR 0954).
package idle

import (
	"sync"
	"sync/atomic"
	"time"
)

// Bound is one owner's bound on its sessions in memory.
type Bound struct {
	// TTL is how long a session may go unused before a sweep forgets it;
	// a sweep runs every TTL/2, at most a minute apart.
	TTL time.Duration
	// Max is how many sessions a trim leaves.
	Max int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Forget drops the sessions last used before cutoff and, when extra > 0,
	// that many of the least recently used, skipping those in use; it
	// returns how many it dropped.
	Forget func(cutoff time.Time, extra int) int
	// Swept, when set, runs after a sweep that dropped some.
	Swept func()

	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	trimming atomic.Bool
}

// Sweep starts the sweep, once; after Stop it starts nothing.
func (b *Bound) Sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil || b.stopped {
		return
	}
	every := min(b.TTL/2, time.Minute)
	b.timer = time.AfterFunc(every, func() {
		if b.Forget(b.now().Add(-b.TTL), 0) > 0 && b.Swept != nil {
			b.Swept()
		}
		b.mu.Lock()
		if !b.stopped {
			b.timer.Reset(every)
		}
		b.mu.Unlock()
	})
}

// Stop ends the sweep.
func (b *Bound) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// Trim is told how many sessions there are now, n: past Max by a quarter
// (so a trim runs once per so many new sessions, not on every one), it
// forgets the n-Max least recently used in the background, unless a trim
// is under way.
func (b *Bound) Trim(n int) {
	if n <= b.Max+b.Max/4 || !b.trimming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer b.trimming.Store(false)
		b.Forget(time.Time{}, n-b.Max)
	}()
}

func (b *Bound) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}
