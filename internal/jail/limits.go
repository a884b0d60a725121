package jail

import (
	"fmt"
	"strconv"
	"strings"
)

// Limits bound what everything in one jail uses together, so that one
// intern's runaway (a fork bomb, a memory hog, a full /tmp) stays its own.
// A zero field leaves that resource unbounded.
//
// Memory, Pids and CPUWeight are a cgroup per jail (v2 where the
// controller is on the unified hierarchy, else v1), made by Start under the
// caller's own cgroup and holding the init before it builds anything;
// Tmpfs sizes the jail's /tmp and /dev/shm; FileSize is RLIMIT_FSIZE.
type Limits struct {
	// Memory is the jail's memory in bytes (page cache and tmpfs pages
	// included; no swap beyond it). Past it the kernel's OOM killer ends
	// the jail's largest process, in this jail only. Its sockets' buffers
	// count too: on v2 in the same figure, on v1 in a TCP counter of their
	// own bounded at the same figure (memory.kmem.tcp.limit_in_bytes),
	// past which writes wait (EAGAIN).
	Memory int64 `json:"memory,omitempty"`
	// Pids bounds the jail's processes and threads: fork and clone fail
	// with EAGAIN past it.
	Pids int `json:"pids,omitempty"`
	// CPUWeight is the jail's share of the CPU when the host is busy,
	// 1–10000 (cgroup v2 cpu.weight; 100 is the default, an equal share
	// with every other jail; v1 cpu.shares is weight×1024/100).
	CPUWeight int `json:"cpu_weight,omitempty"`
	// CPUs caps the jail's CPU time at this many CPUs' worth (cgroup v2
	// cpu.max, v1 cpu.cfs_quota_us), even on an idle host.
	CPUs float64 `json:"cpus,omitempty"`
	// Tmpfs is the size in bytes of /tmp, and separately of /dev/shm.
	Tmpfs int64 `json:"tmpfs,omitempty"`
	// FileSize is the largest file any process of the jail may write
	// (RLIMIT_FSIZE): a write past it fails with EFBIG after SIGXFSZ.
	FileSize int64 `json:"file_size,omitempty"`
}

// cgroups reports whether l needs a cgroup.
func (l Limits) cgroups() bool { return l.Memory > 0 || l.Pids > 0 || l.CPUWeight > 0 || l.CPUs > 0 }

// tmpfsData is the mount data of a tmpfs of the jail that its programs
// write to (/tmp, /dev/shm).
func (l Limits) tmpfsData(mode string) string {
	if l.Tmpfs > 0 {
		return "mode=" + mode + ",size=" + strconv.FormatInt(l.Tmpfs, 10)
	}
	return "mode=" + mode
}

// cgroupPrefix names the cgroups Start makes (cohort-jail-<init's pid>).
const cgroupPrefix = "cohort-jail-"

// ParseSize reads a size as operators write it: bytes, or a number with
// K, M, G, T (powers of 1024, with or without "iB"/"B"). "0" is 0.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		for _, tail := range []string{u.suffix + "iB", u.suffix + "B", u.suffix, strings.ToLower(u.suffix)} {
			if v, ok := strings.CutSuffix(t, tail); ok {
				t, mult = strings.TrimSpace(v), u.mult
				goto num
			}
		}
	}
num:
	t = strings.TrimSuffix(t, "B")
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 || n*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("%q is not a size such as 4GiB, 512MiB or 0", s)
	}
	return int64(n * float64(mult)), nil
}

// FormatSize writes a size the way ParseSize reads it, exactly.
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
