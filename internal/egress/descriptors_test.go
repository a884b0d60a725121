//go:build unix

package egress_test

import (
	"syscall"
	"testing"

	"github.com/cohort-dev/cohort/internal/egress"
)

// RaiseFileLimit leaves the soft limit at the hard one (or the runtime's
// hard-1) and says it.
func TestRaiseFileLimit(t *testing.T) {
	n, err := egress.RaiseFileLimit()
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if n != lim.Cur || lim.Cur+1 < lim.Max {
		t.Fatalf("RaiseFileLimit said %d; the limit is %d of %d", n, lim.Cur, lim.Max)
	}
	t.Logf("RLIMIT_NOFILE %d of %d", lim.Cur, lim.Max)
}
