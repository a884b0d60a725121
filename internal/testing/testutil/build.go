package testutil

import (
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// Builds compiles Go commands for a test binary, each at most once: the
// first test that asks builds it into Dir, later ones get the same file
// (or the same build error).
type Builds struct {
	Dir string

	mu   sync.Mutex
	done map[string]*build
}

type build struct {
	once sync.Once
	bin  string
	err  error
}

// Binary returns the path of the command at import path pkg, built once.
func (b *Builds) Binary(t testing.TB, pkg string) string {
	t.Helper()
	b.mu.Lock()
	if b.done == nil {
		b.done = map[string]*build{}
	}
	one := b.done[pkg]
	if one == nil {
		one = &build{}
		b.done[pkg] = one
	}
	b.mu.Unlock()
	one.once.Do(func() {
		one.bin = filepath.Join(b.Dir, path.Base(pkg))
		if out, err := exec.Command("go", "build", "-o", one.bin, pkg).CombinedOutput(); err != nil {
			one.err = fmt.Errorf("go build %s: %v: %s", pkg, err, out)
		}
	})
	if one.err != nil {
		t.Fatal(one.err)
	}
	return one.bin
}
