// Package gvisortest finds the runsc that the gvisor backend's tests run:
// the release pinned in tools/gvisor (systrap platform), built into the Go
// build cache, and Debian's package (ptrace platform, release 2022-12-19)
// for the quick start on it (ADR 0997).
package gvisortest

import (
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/cohort-dev/cohort/internal/provision/gvisor"
	"github.com/cohort-dev/cohort/internal/testing/gotool"
)

// Runsc is the pinned runsc, checked to start a sandbox here. Where it
// cannot be built or run the test fails under CI and is skipped elsewhere.
func Runsc(t testing.TB) string {
	t.Helper()
	pinned.once.Do(func() {
		paths, err := gotool.Build("gvisor", []string{"CGO_ENABLED=0"}, "gvisor.dev/gvisor/runsc")
		if err == nil {
			pinned.path = paths[0]
			_, err = gvisor.CheckRunsc(pinned.path, "")
		}
		pinned.err = err
	})
	need(t, pinned.err, "build it with: CGO_ENABLED=0 go tool -modfile=tools/gvisor/go.mod -n gvisor.dev/gvisor/runsc")
	return pinned.path
}

// Debian is the runsc of Debian's package (apt-get install runsc), the
// one `runsc` on PATH names, checked to start a sandbox here.
func Debian(t testing.TB) string {
	t.Helper()
	debian.once.Do(func() {
		debian.path, debian.err = exec.LookPath("runsc")
		if debian.err == nil {
			_, debian.err = gvisor.CheckRunsc(debian.path, "")
		}
	})
	need(t, debian.err, "install it with: apt-get install "+gvisor.Package)
	return debian.path
}

var pinned, debian struct {
	once sync.Once
	path string
	err  error
}

func need(t testing.TB, err error, how string) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("runsc: %v (%s)", err, how)
	}
	t.Skipf("SKIPPING: runsc: %v (%s)", err, how)
}
