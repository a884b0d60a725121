package testutil

import (
	"os"
	"strings"
	"testing"
)

// TestBuildsOnce: a second ask returns the same file without building it
// again (the file is removed and not rebuilt); a package that does not
// build fails the asking test with the compiler's words.
func TestBuildsOnce(t *testing.T) {
	b := &Builds{Dir: t.TempDir()}
	bin := b.Binary(t, "github.com/cohort-dev/cohort/internal/testing/testutil/testdata/hello")
	if _, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	}
	os.Remove(bin)
	if again := b.Binary(t, "github.com/cohort-dev/cohort/internal/testing/testutil/testdata/hello"); again != bin {
		t.Fatalf("second ask %q, first %q", again, bin)
	}
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Fatalf("built again: %v", err)
	}

	var ft fakeT
	func() {
		defer func() { recover() }()
		b.Binary(&ft, "github.com/cohort-dev/cohort/internal/testing/testutil/testdata/broken")
	}()
	if !strings.Contains(ft.msg, "undefined: nothere") {
		t.Fatalf("build error not reported: %q", ft.msg)
	}
}

// fakeT records Fatal's message and stops the call as Fatal does.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatal(args ...any) {
	for _, a := range args {
		if e, ok := a.(error); ok {
			f.msg += e.Error()
		}
	}
	panic("fatal")
}
