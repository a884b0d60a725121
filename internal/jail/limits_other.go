//go:build !linux

package jail

// CheckLimits: no cgroups off Linux (nor jails).
func CheckLimits(l Limits) []string {
	if l.cgroups() {
		return []string{"memory, processes and CPU share: no cgroups on this platform"}
	}
	return nil
}

// SweepCgroups has nothing to sweep off Linux.
func SweepCgroups() {}
