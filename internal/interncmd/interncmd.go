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
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
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
	// A heap sample per 16 KiB allocated, not per 512 KiB: enough samples
	// in a heap profile of a few MB, little cost beside the CPU profile's.
	runtime.MemProfileRate = 16 << 10
	out, err := os.Create(prefix + "." + filepath.Base(os.Args[1]) + ".pprof")
	if err != nil {
		return err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	// SIGUSR1 appends the memory's parts to <prefix>.<command>.mem (the
	// heap before and after a collection, the stacks, the goroutines) and
	// writes the heap and goroutine profiles after it: `cohort-bench e2e
	// --profile-dir` sends it before and while it holds its open streams.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		name := prefix + "." + filepath.Base(os.Args[1])
		for range usr1 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			runtime.GC()
			runtime.ReadMemStats(&after)
			if f, err := os.OpenFile(name+".mem", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				fmt.Fprintf(f, "heap %d live %d stacks %d goroutines %d\n", before.HeapAlloc, after.HeapAlloc, after.StackInuse, runtime.NumGoroutine())
				f.Close()
			}
			for _, p := range []string{"heap", "goroutine"} {
				if out, err := os.Create(name + "." + p + ".pprof"); err == nil {
					pprof.Lookup(p).WriteTo(out, 0)
					out.Close()
				}
			}
		}
	}()
	return f()
}

// LimitFlags declares the bounds of each intern's jail (serve, and
// `cohort intern --jail`); the returned func checks them after parsing,
// naming the flag (and its variable) that is wrong. 0 leaves one unbounded.
func LimitFlags(fs *flag.FlagSet, l *config.InternLimits, what string) func() error {
	memory := config.String(fs, "intern-memory", jail.FormatSize(l.Memory), what+", the memory of each intern's jail (its processes, page cache and tmpfs together); past it the kernel ends its largest process; 0 unbounded")
	procs := config.String(fs, "intern-max-processes", strconv.Itoa(l.Processes), what+", the processes and threads of each intern's jail at once; past it fork fails; 0 unbounded")
	cpu := config.String(fs, "intern-cpu-weight", strconv.Itoa(l.CPUWeight), what+", each intern's share of the CPU when it is busy, 1–10000, 100 an equal share; 0 none of its own")
	cpus := config.String(fs, "intern-cpus", strconv.FormatFloat(l.CPUs, 'f', -1, 64), what+", a cap on each intern's CPU time in CPUs (0.5, 2), even on an idle host; default all of this host's but one; 0 none")
	tmpfs := config.String(fs, "intern-tmpfs", jail.FormatSize(l.Tmpfs), what+", the size of each intern's /tmp, and of its /dev/shm; 0 unbounded")
	disk := config.String(fs, "intern-disk", jail.FormatSize(l.Disk), what+", the disk of each intern's directory (each file's size where the file system has no quota: the start log says which); 0 unbounded")
	return func() error {
		var err error
		size := func(name, v string) int64 {
			n, e := jail.ParseSize(v)
			if e != nil && err == nil {
				err = fmt.Errorf("%s: %w", config.Setting(name), e)
			}
			return n
		}
		count := func(name, v string, most int) int {
			n, e := strconv.Atoi(v)
			if (e != nil || n < 0 || n > most) && err == nil {
				err = fmt.Errorf("%s: %q is not a whole number from 0 to %d", config.Setting(name), v, most)
			}
			return n
		}
		float := func(name, v string) float64 {
			n, e := strconv.ParseFloat(v, 64)
			if (e != nil || n < 0 || n > 1024) && err == nil {
				err = fmt.Errorf("%s: %q is not a number of CPUs such as 0.5 or 2 (0: no cap)", config.Setting(name), v)
			}
			return n
		}
		*l = config.InternLimits{
			Memory:    size("intern-memory", *memory),
			Processes: count("intern-max-processes", *procs, 1<<22),
			CPUWeight: count("intern-cpu-weight", *cpu, 10000),
			CPUs:      float("intern-cpus", *cpus),
			Tmpfs:     size("intern-tmpfs", *tmpfs),
			Disk:      size("intern-disk", *disk),
		}
		if err == nil && l.Memory > 0 && l.Memory < 64<<20 {
			err = fmt.Errorf("%s: %s is too little for a daemon and its agent (64MiB at least)", config.Setting("intern-memory"), *memory)
		}
		if err == nil && l.Processes > 0 && l.Processes < 32 {
			err = fmt.Errorf("%s: %d is too few for a daemon and its agent (32 at least)", config.Setting("intern-max-processes"), l.Processes)
		}
		return err
	}
}
