package idle

import (
	"testing"
	"time"
)

// A trim runs past Max by a quarter, not before, down to Max; one at a
// time.
func TestTrimBound(t *testing.T) {
	calls := make(chan int, 4)
	release := make(chan struct{})
	b := &Bound{Max: 8, Forget: func(cutoff time.Time, extra int) int {
		if !cutoff.IsZero() {
			t.Errorf("a trim passed cutoff %v: it forgets by count only", cutoff)
		}
		calls <- extra
		<-release
		return extra
	}}
	b.Trim(10) // 8 + 8/4 = 10: not past it
	b.Trim(11)
	if got := <-calls; got != 3 {
		t.Fatalf("trim of 11 forgets %d, want 3 (down to Max)", got)
	}
	b.Trim(12) // the first is under way: nothing
	close(release)
	select {
	case extra := <-calls:
		t.Fatalf("a second trim (%d) ran while the first was under way, or one ran at 10", extra)
	default:
	}
}

// A stopped bound starts no sweep.
func TestStopBeforeSweep(t *testing.T) {
	b := &Bound{TTL: time.Minute, Forget: func(time.Time, int) int { return 0 }}
	b.Stop()
	b.Sweep()
	if b.timer != nil {
		t.Fatal("a sweep started after Stop")
	}
}
