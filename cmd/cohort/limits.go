package main

import (
	"flag"
	"fmt"
	"strconv"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/jail"
)

// internLimitFlags declares an intern's own limits for `cohort admin intern
// create|update`: each at most the operator's, "0" the operator's.
func internLimitFlags(fs *flag.FlagSet, f *adminFlags) {
	fs.StringVar(&f.memory, "memory", "", "the intern's own memory bound (4GiB, 512MiB; 0: the operator's --intern-memory)")
	fs.StringVar(&f.maxProcesses, "max-processes", "", "the intern's own bound on processes and threads (0: the operator's --intern-max-processes)")
	fs.StringVar(&f.cpuWeight, "cpu-weight", "", "the intern's own CPU share, 1–10000 (0: the operator's --intern-cpu-weight)")
	fs.StringVar(&f.cpus, "cpus", "", "the intern's own cap in CPUs, such as 0.5 (0: the operator's --intern-cpus)")
	fs.StringVar(&f.tmpfs, "tmpfs", "", "the intern's own size of /tmp and /dev/shm (0: the operator's --intern-tmpfs)")
	fs.StringVar(&f.disk, "disk", "", "the intern's own disk bound (0: the operator's --intern-disk)")
}

// limits is the request's InternLimits from the flags given, or nil; the
// service checks the values' ranges and names the field.
func (f *adminFlags) limits() (*cohortv1.InternLimits, error) {
	var out cohortv1.InternLimits
	set := false
	var err error
	sizeOf := func(name, v string) *int64 {
		if v == "" {
			return nil
		}
		set = true
		n, e := jail.ParseSize(v)
		if e != nil && err == nil {
			err = fmt.Errorf("--%s: %w", name, e)
		}
		return &n
	}
	countOf := func(name, v string) *int32 {
		if v == "" {
			return nil
		}
		set = true
		n, e := strconv.ParseInt(v, 10, 32)
		if e != nil && err == nil {
			err = fmt.Errorf("--%s: %q is not a whole number", name, v)
		}
		m := int32(n)
		return &m
	}
	out.MemoryBytes = sizeOf("memory", f.memory)
	out.MaxProcesses = countOf("max-processes", f.maxProcesses)
	out.CpuWeight = countOf("cpu-weight", f.cpuWeight)
	if f.cpus != "" {
		set = true
		n, e := strconv.ParseFloat(f.cpus, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("--cpus: %q is not a number of CPUs such as 0.5 or 2", f.cpus)
		}
		out.Cpus = &n
	}
	out.TmpfsBytes = sizeOf("tmpfs", f.tmpfs)
	out.DiskBytes = sizeOf("disk", f.disk)
	if err != nil || !set {
		return nil, err
	}
	return &out, nil
}
