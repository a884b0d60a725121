package interncmd

import (
	"os"
	"runtime"
)

// oneProc runs the daemon and the built-in agent on one P unless GOMAXPROCS
// says otherwise. Each serves one intern and per model chunk does a read,
// a little decoding and a write; with a P per core, every wake-up also
// woke a second thread to spin looking for work, the largest share of the
// daemon's CPU per paced chunk (ADR 0991). Their parallel work (commands,
// tools, a catalog agent) runs in child processes, which this does not cap.
func oneProc() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}
