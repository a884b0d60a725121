// Package interncmd is the commands that run inside an intern's jail, or
// for it: the daemon (`intern`) and the built-in agent (`agent`), with the
// settings, logger and tracing they need. cmd/cohort and the small
// cmd/cohort-intern both run them; this package links nothing of the
// gateway (its test says what it must not import), so a jail's processes
// do not pay for the gateway's package initializers.
package interncmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// NewLogger is the JSON logger of every command, at level.
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// StartTracing starts OpenTelemetry tracing when the OTEL_* variables ask
// for it (internal/telemetry); the returned function flushes it.
func StartTracing(ctx context.Context, service string) (func(), error) {
	stop, err := telemetry.Start(ctx, service)
	if err != nil {
		return nil, fmt.Errorf("tracing (OTEL_*): %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stop(ctx)
	}, nil
}

// Profiled runs f under a CPU profile written to
// $COHORT_CPUPROFILE.<command>.pprof when that variable is set (any command;
// `cohort-bench chat --profile-dir` sets it for the gateway and daemon it
// starts, and the agents a daemon starts inherit it, hence the command in
// the name).
func Profiled(f func() error) error {
	prefix := os.Getenv("COHORT_CPUPROFILE")
	if prefix == "" || len(os.Args) < 2 {
		return f()
	}
	out, err := os.Create(prefix + "." + filepath.Base(os.Args[1]) + ".pprof")
	if err != nil {
		return err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return f()
}

// LimitFlags declares the bounds of each intern's jail (serve, and
// `cohort intern --jail`); the returned func checks them after parsing,
// naming the flag (and its variable) that is wrong. 0 leaves one unbounded.
func LimitFlags(fs *flag.FlagSet, l *config.InternLimits, what string) func() error {
	memory := fs.String("intern-memory", config.Env("COHORT_INTERN_MEMORY", jail.FormatSize(l.Memory)), what+", the memory of each intern's jail (its processes, page cache and tmpfs together); past it the kernel ends its largest process; 0 unbounded (COHORT_INTERN_MEMORY)")
	procs := fs.String("intern-max-processes", config.Env("COHORT_INTERN_MAX_PROCESSES", strconv.Itoa(l.Processes)), what+", the processes and threads of each intern's jail at once; past it fork fails; 0 unbounded (COHORT_INTERN_MAX_PROCESSES)")
	cpu := fs.String("intern-cpu-weight", config.Env("COHORT_INTERN_CPU_WEIGHT", strconv.Itoa(l.CPUWeight)), what+", each intern's share of the CPU when it is busy, 1–10000, 100 an equal share; 0 none of its own (COHORT_INTERN_CPU_WEIGHT)")
	cpus := fs.String("intern-cpus", config.Env("COHORT_INTERN_CPUS", strconv.FormatFloat(l.CPUs, 'f', -1, 64)), what+", a cap on each intern's CPU time in CPUs (0.5, 2), even on an idle host; default all of this host's but one; 0 none (COHORT_INTERN_CPUS)")
	tmpfs := fs.String("intern-tmpfs", config.Env("COHORT_INTERN_TMPFS", jail.FormatSize(l.Tmpfs)), what+", the size of each intern's /tmp, and of its /dev/shm; 0 unbounded (COHORT_INTERN_TMPFS)")
	disk := fs.String("intern-disk", config.Env("COHORT_INTERN_DISK", jail.FormatSize(l.Disk)), what+", the disk of each intern's directory (each file's size where the file system has no quota: the start log says which); 0 unbounded (COHORT_INTERN_DISK)")
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
