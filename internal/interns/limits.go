package interns

import (
	"math"
	"strconv"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
)

// Bounds of an intern's own limits, whatever the operator's settings: the
// least a daemon and its agent start in, and the most that is plausibly a
// typo rather than a wish (ADR 0024). The minima are serve's for --intern-memory and
// --intern-max-processes.
const (
	MinLimitMemory    = 64 << 20
	MaxLimitMemory    = 1 << 40
	MinLimitProcesses = 32
	MaxLimitProcesses = 1 << 22
	MaxLimitCPUWeight = 10000
	MinLimitCPUs      = 0.01 // a 1 ms quota in the kernel's 100 ms period
	MaxLimitCPUs      = 1024
	MinLimitTmpfs     = 1 << 20
	MaxLimitTmpfs     = 1 << 40
	MinLimitDisk      = 1 << 20
	MaxLimitDisk      = 1 << 50
)

// setLimits applies the fields present in req to cur: 0 returns a field to
// the operator's setting; any other value must lie in the bounds above and
// at or below ceiling's (where that is not 0, unbounded). The error is a
// 400 naming the field, or a 403 when p is not a management key.
func setLimits(p *auth.Principal, ceiling config.InternLimits, cur *config.InternLimits, req *cohortv1.InternLimits) error {
	if req == nil {
		return nil
	}
	if req.MemoryBytes == nil && req.MaxProcesses == nil && req.CpuWeight == nil && req.Cpus == nil && req.TmpfsBytes == nil && req.DiskBytes == nil {
		return nil
	}
	if !p.IsManagement() {
		// A workspace key could otherwise raise what a management key
		// lowered for its intern.
		return apierr.Forbidden("an intern's limits are set with a management key")
	}
	next := *cur
	if req.MemoryBytes != nil {
		if err := checkSize("limits.memory_bytes", "--intern-memory", req.GetMemoryBytes(), MinLimitMemory, MaxLimitMemory, ceiling.Memory); err != nil {
			return err
		}
		next.Memory = req.GetMemoryBytes()
	}
	if req.MaxProcesses != nil {
		if err := checkCount("limits.max_processes", "--intern-max-processes", int64(req.GetMaxProcesses()), MinLimitProcesses, MaxLimitProcesses, int64(ceiling.Processes)); err != nil {
			return err
		}
		next.Processes = int(req.GetMaxProcesses())
	}
	if req.CpuWeight != nil {
		if err := checkCount("limits.cpu_weight", "--intern-cpu-weight", int64(req.GetCpuWeight()), 1, MaxLimitCPUWeight, int64(ceiling.CPUWeight)); err != nil {
			return err
		}
		next.CPUWeight = int(req.GetCpuWeight())
	}
	if req.Cpus != nil {
		v := req.GetCpus()
		switch {
		case v == 0:
		case math.IsNaN(v) || v < MinLimitCPUs || v > MaxLimitCPUs:
			return apierr.BadRequest("limits.cpus must be from %g to %d CPUs (0: the operator's setting), not %g", MinLimitCPUs, MaxLimitCPUs, v)
		case ceiling.CPUs > 0 && v > ceiling.CPUs:
			return apierr.BadRequest("limits.cpus: %g is above this gateway's setting for every intern (--intern-cpus %g)", v, ceiling.CPUs)
		}
		next.CPUs = v
	}
	if req.TmpfsBytes != nil {
		if err := checkSize("limits.tmpfs_bytes", "--intern-tmpfs", req.GetTmpfsBytes(), MinLimitTmpfs, MaxLimitTmpfs, ceiling.Tmpfs); err != nil {
			return err
		}
		next.Tmpfs = req.GetTmpfsBytes()
	}
	if req.DiskBytes != nil {
		if err := checkSize("limits.disk_bytes", "--intern-disk", req.GetDiskBytes(), MinLimitDisk, MaxLimitDisk, ceiling.Disk); err != nil {
			return err
		}
		next.Disk = req.GetDiskBytes()
	}
	*cur = next
	return nil
}

func checkSize(field, flag string, v, least, most, ceiling int64) error {
	switch {
	case v == 0:
	case v < least || v > most:
		return apierr.BadRequest("%s must be from %s to %s (0: the operator's setting), not %d", field, size(least), size(most), v)
	case ceiling > 0 && v > ceiling:
		return apierr.BadRequest("%s: %s is above this gateway's setting for every intern (%s %s)", field, size(v), flag, size(ceiling))
	}
	return nil
}

func checkCount(field, flag string, v, least, most, ceiling int64) error {
	switch {
	case v == 0:
	case v < least || v > most:
		return apierr.BadRequest("%s must be from %d to %d (0: the operator's setting), not %d", field, least, most, v)
	case ceiling > 0 && v > ceiling:
		return apierr.BadRequest("%s: %d is above this gateway's setting for every intern (%s %d)", field, v, flag, ceiling)
	}
	return nil
}

// size writes bytes as operators read them (4GiB, 1536MiB, 100000).
func size(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// limitsProto is the intern's own limits, the fields it sets only.
func limitsProto(l config.InternLimits) *cohortv1.InternLimits {
	if l == (config.InternLimits{}) {
		return nil
	}
	out := &cohortv1.InternLimits{}
	if l.Memory > 0 {
		out.MemoryBytes = &l.Memory
	}
	if l.Processes > 0 {
		n := int32(l.Processes)
		out.MaxProcesses = &n
	}
	if l.CPUWeight > 0 {
		n := int32(l.CPUWeight)
		out.CpuWeight = &n
	}
	if l.CPUs > 0 {
		out.Cpus = &l.CPUs
	}
	if l.Tmpfs > 0 {
		out.TmpfsBytes = &l.Tmpfs
	}
	if l.Disk > 0 {
		out.DiskBytes = &l.Disk
	}
	return out
}
