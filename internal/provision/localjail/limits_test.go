package localjail

import (
	"testing"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/jail"
)

// An intern's own limits lower the operator's, never raise them: an
// operator who lowers a setting after an intern's was set still bounds it.
// An operator's 0 (unbounded) takes the intern's.
func TestInternLimitsLowerTheOperators(t *testing.T) {
	op := jail.Limits{Memory: 1 << 30, Pids: 512, CPUWeight: 100, CPUs: 1, Tmpfs: 64 << 20, FileSize: 0}
	got := internLimits(op, config.InternLimits{Memory: 256 << 20, Processes: 1024, CPUWeight: 50, CPUs: 2, Disk: 1 << 20})
	want := jail.Limits{Memory: 256 << 20, Pids: 512, CPUWeight: 50, CPUs: 1, Tmpfs: 64 << 20, FileSize: 1 << 20}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := internLimits(op, config.InternLimits{}); got != op {
		t.Errorf("no limits of its own: %+v, want the operator's %+v", got, op)
	}
}
