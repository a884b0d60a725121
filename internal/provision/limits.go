package provision

import (
	"fmt"

	"github.com/cohort-dev/cohort/internal/jail"
)

// LimitWarnings says which of the jails' limits this host cannot enforce,
// one line each, for the start log: a missing cgroup controller, a cgroup
// the gateway may not make, and always the disk bound's reach (no quota
// of the intern's directory as a whole: RLIMIT_FSIZE bounds each file).
// It also removes the cgroups of jails that ended with no gateway attached.
func (p *Provisioner) LimitWarnings() []string {
	if p.Jail == nil {
		return nil
	}
	jail.SweepCgroups()
	return LimitWarnings(p.Jail.Limits)
}

// LimitWarnings is Provisioner.LimitWarnings for any jail's limits
// (`cohort intern --jail`).
func LimitWarnings(l jail.Limits) []string {
	out := jail.CheckLimits(l)
	if l.FileSize > 0 {
		out = append(out, fmt.Sprintf("disk: an intern's directory is not bounded as a whole (the gateway sets no file system quota); each file in it is bounded at %s (RLIMIT_FSIZE)", jail.FormatSize(l.FileSize)))
	}
	return out
}
