package interncmd

import (
	"runtime"
	"testing"
)

// The daemon and the agent run on one P, unless GOMAXPROCS says otherwise
// (ADR 0991).
func TestOneProc(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(4)
	t.Setenv("GOMAXPROCS", "")
	oneProc()
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("without GOMAXPROCS: %d Ps, want 1", n)
	}
	runtime.GOMAXPROCS(4)
	t.Setenv("GOMAXPROCS", "4")
	oneProc()
	if n := runtime.GOMAXPROCS(0); n != 4 {
		t.Errorf("with GOMAXPROCS=4: %d Ps, want 4 (left alone)", n)
	}
}
