package localjail

import (
	"fmt"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/jail"
)

// internLimits is an intern's jail's limits: the operator's, each lowered
// to the intern's own where it has one. The operator's stay the ceiling
// even when lowered after an intern's were set (the API checks them only
// when they are set).
func internLimits(op jail.Limits, own config.InternLimits) jail.Limits {
	l := op
	l.Memory = lower(op.Memory, own.Memory)
	l.Pids = lower(op.Pids, own.Processes)
	l.CPUWeight = lower(op.CPUWeight, own.CPUWeight)
	l.CPUs = lower(op.CPUs, own.CPUs)
	l.Tmpfs = lower(op.Tmpfs, own.Tmpfs)
	l.FileSize = lower(op.FileSize, own.Disk)
	return l
}

// lower is own where it is set (not 0) and below op, or op unbounded (0).
func lower[T int | int64 | float64](op, own T) T {
	if own > 0 && (op == 0 || own < op) {
		return own
	}
	return op
}

// LimitWarnings says which of the jails' limits this host cannot enforce,
// one line each, for the start log: a missing cgroup controller, a cgroup
// the gateway may not make, and always the disk bound's reach (no quota
// of the intern's directory as a whole: RLIMIT_FSIZE bounds each file).
// It also removes the cgroups of jails that ended with no gateway attached.
func (b *Backend) LimitWarnings() []string {
	if b.Jail == nil {
		return nil
	}
	jail.SweepCgroups()
	return LimitWarnings(b.Jail.Limits)
}

// LimitWarnings is Backend.LimitWarnings for any jail's limits
// (`cohort intern --jail`).
func LimitWarnings(l jail.Limits) []string {
	out := jail.CheckLimits(l)
	if jail.LandlockABI() < 1 {
		out = append(out, "isolation: a command can read and write its agent's memory through /proc (same user); "+jail.ErrNoLandlock.Error())
	}
	if l.FileSize > 0 {
		out = append(out, fmt.Sprintf("disk: an intern's directory is not bounded as a whole (the gateway sets no file system quota); each file in it is bounded at %s (RLIMIT_FSIZE)", jail.FormatSize(l.FileSize)))
	}
	return out
}
