package main

import (
	"flag"
	"fmt"
	"strconv"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/jail"
)

// limitFlags declares the bounds of each intern's jail (serve, and
// `cohort intern --jail`); the returned func checks them after parsing,
// naming the flag (and its variable) that is wrong. 0 leaves one unbounded.
func limitFlags(fs *flag.FlagSet, l *config.InternLimits, what string) func() error {
	memory := fs.String("intern-memory", env("COHORT_INTERN_MEMORY", jail.FormatSize(l.Memory)), what+", the memory of each intern's jail (its processes, page cache and tmpfs together); past it the kernel ends its largest process; 0 unbounded (COHORT_INTERN_MEMORY)")
	procs := fs.String("intern-max-processes", env("COHORT_INTERN_MAX_PROCESSES", strconv.Itoa(l.Processes)), what+", the processes and threads of each intern's jail at once; past it fork fails; 0 unbounded (COHORT_INTERN_MAX_PROCESSES)")
	cpu := fs.String("intern-cpu-weight", env("COHORT_INTERN_CPU_WEIGHT", strconv.Itoa(l.CPUWeight)), what+", each intern's share of the CPU when it is busy, 1–10000, 100 an equal share; 0 none of its own (COHORT_INTERN_CPU_WEIGHT)")
	cpus := fs.String("intern-cpus", env("COHORT_INTERN_CPUS", strconv.FormatFloat(l.CPUs, 'f', -1, 64)), what+", a cap on each intern's CPU time in CPUs (0.5, 2), even on an idle host; default all of this host's but one; 0 none (COHORT_INTERN_CPUS)")
	tmpfs := fs.String("intern-tmpfs", env("COHORT_INTERN_TMPFS", jail.FormatSize(l.Tmpfs)), what+", the size of each intern's /tmp, and of its /dev/shm; 0 unbounded (COHORT_INTERN_TMPFS)")
	disk := fs.String("intern-disk", env("COHORT_INTERN_DISK", jail.FormatSize(l.Disk)), what+", the disk of each intern's directory (each file's size where the file system has no quota: the start log says which); 0 unbounded (COHORT_INTERN_DISK)")
	return func() error {
		var err error
		size := func(name, env, v string) int64 {
			n, e := jail.ParseSize(v)
			if e != nil && err == nil {
				err = fmt.Errorf("--%s (%s): %w", name, env, e)
			}
			return n
		}
		count := func(name, env, v string, most int) int {
			n, e := strconv.Atoi(v)
			if (e != nil || n < 0 || n > most) && err == nil {
				err = fmt.Errorf("--%s (%s): %q is not a whole number from 0 to %d", name, env, v, most)
			}
			return n
		}
		float := func(name, env, v string) float64 {
			n, e := strconv.ParseFloat(v, 64)
			if (e != nil || n < 0 || n > 1024) && err == nil {
				err = fmt.Errorf("--%s (%s): %q is not a number of CPUs such as 0.5 or 2 (0: no cap)", name, env, v)
			}
			return n
		}
		*l = config.InternLimits{
			Memory:    size("intern-memory", "COHORT_INTERN_MEMORY", *memory),
			Processes: count("intern-max-processes", "COHORT_INTERN_MAX_PROCESSES", *procs, 1<<22),
			CPUWeight: count("intern-cpu-weight", "COHORT_INTERN_CPU_WEIGHT", *cpu, 10000),
			CPUs:      float("intern-cpus", "COHORT_INTERN_CPUS", *cpus),
			Tmpfs:     size("intern-tmpfs", "COHORT_INTERN_TMPFS", *tmpfs),
			Disk:      size("intern-disk", "COHORT_INTERN_DISK", *disk),
		}
		if err == nil && l.Memory > 0 && l.Memory < 64<<20 {
			err = fmt.Errorf("--intern-memory (COHORT_INTERN_MEMORY): %s is too little for a daemon and its agent (64MiB at least)", *memory)
		}
		if err == nil && l.Processes > 0 && l.Processes < 32 {
			err = fmt.Errorf("--intern-max-processes (COHORT_INTERN_MAX_PROCESSES): %d is too few for a daemon and its agent (32 at least)", l.Processes)
		}
		return err
	}
}

// jailLimits is what the jail enforces of an operator's limits.
func jailLimits(l config.InternLimits) jail.Limits {
	return jail.Limits{Memory: l.Memory, Pids: l.Processes, CPUWeight: l.CPUWeight, CPUs: l.CPUs, Tmpfs: l.Tmpfs, FileSize: l.Disk}
}

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
