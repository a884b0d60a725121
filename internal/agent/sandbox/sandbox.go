// Package sandbox runs the built-in agent's shell commands, either directly or
// confined by bubblewrap (Debian package `bubblewrap`).
//
// Confined commands see a read-only root file system, a writable work
// directory, a private writable /tmp, no network (a fresh network namespace
// with only `lo`) and a fresh PID namespace; they die with the agent. Both
// modes bound the command's time and the output kept, and run it with an
// environment scrubbed of credentials, so the model never reads the agent's
// API key through the shell.
package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Defaults for Spec fields left zero.
const (
	DefaultTimeout   = 60 * time.Second
	DefaultMaxOutput = 64 << 10
)

// ErrUnavailable is returned when a confined run is asked for and bwrap is
// not installed: the caller must fail closed rather than run unconfined.
var ErrUnavailable = errors.New("sandbox unavailable: bwrap (Debian package bubblewrap) is not installed")

// Spec describes one command.
type Spec struct {
	// Command is run by `sh -c`.
	Command string
	// Dir is the working directory, and the only writable directory when
	// Confined (besides a private /tmp).
	Dir string
	// Confined runs the command under bubblewrap.
	Confined bool
	// Timeout bounds the run; DefaultTimeout when zero.
	Timeout time.Duration
	// MaxOutput bounds the combined stdout and stderr kept; DefaultMaxOutput
	// when zero. The rest is counted and dropped.
	MaxOutput int
	// Bwrap is the bwrap executable; "bwrap" from PATH when empty.
	Bwrap string
}

// Result is what the command did.
type Result struct {
	// Output is the combined stdout and stderr, at most MaxOutput bytes.
	Output string
	// TotalBytes is how much output the command wrote in all.
	TotalBytes int64
	// Truncated reports that output was dropped.
	Truncated bool
	// ExitCode is the exit status; -1 when the command was killed.
	ExitCode int
	// TimedOut reports that the timeout killed the command.
	TimedOut bool
	// Confined reports that bubblewrap confined the command.
	Confined bool
	// Duration is the wall time.
	Duration time.Duration
}

// Available reports whether bwrap can be found.
func Available(bwrap string) bool {
	if bwrap == "" {
		bwrap = "bwrap"
	}
	_, err := exec.LookPath(bwrap)
	return err == nil
}

// Run runs the command and waits for it. Cancelling ctx kills the command's
// whole process group and returns ctx's error; a timeout is not an error but
// a Result with TimedOut set, because the model is told about it.
func Run(ctx context.Context, s Spec) (Result, error) {
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MaxOutput <= 0 {
		s.MaxOutput = DefaultMaxOutput
	}
	if s.Dir == "" {
		return Result{}, errors.New("sandbox: no work directory")
	}
	argv := []string{"sh", "-c", s.Command}
	if s.Confined {
		bwrap := s.Bwrap
		if bwrap == "" {
			bwrap = "bwrap"
		}
		path, err := exec.LookPath(bwrap)
		if err != nil {
			return Result{}, ErrUnavailable
		}
		argv = append([]string{path,
			"--ro-bind", "/", "/",
			"--dev", "/dev",
			"--proc", "/proc",
			// A private /tmp: many tools need a writable one, and it must not
			// be the host's.
			"--tmpfs", "/tmp",
			"--bind", s.Dir, s.Dir,
			"--chdir", s.Dir,
			"--unshare-net",
			"--unshare-pid",
			"--die-with-parent",
			"--"}, argv...)
	}
	runCtx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, argv[0], argv[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = Environ(os.Environ())
	cmd.Stdin = nil
	out := &capped{max: s.MaxOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	// Its own process group, so a timeout kills what the command started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A background child holding the pipes open must not hold us past the kill.
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err := cmd.Run()
	res := Result{
		Output:     out.buf.String(),
		TotalBytes: out.total,
		Truncated:  out.total > int64(out.buf.Len()),
		Confined:   s.Confined,
		Duration:   time.Since(start),
		ExitCode:   -1,
	}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if runCtx.Err() != nil {
		res.TimedOut = true
		return res, nil
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) && !errors.Is(err, exec.ErrWaitDelay) {
		return res, fmt.Errorf("sandbox: start: %w", err)
	}
	return res, nil
}

// Environ returns env without variables that look like credentials: the
// agent's own API key lives in its environment and must not reach a command
// the model chose.
func Environ(env []string) []string {
	kept := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if secretName(name) {
			continue
		}
		kept = append(kept, kv)
	}
	return kept
}

func secretName(name string) bool {
	u := strings.ToUpper(name)
	if strings.HasPrefix(u, "COHORT_AGENT_") {
		return true
	}
	for _, s := range []string{"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL"} {
		if strings.Contains(u, s) {
			return true
		}
	}
	return false
}

// capped keeps the first max bytes written and counts the rest.
type capped struct {
	buf   bytes.Buffer
	max   int
	total int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	if room := c.max - c.buf.Len(); room > 0 {
		if len(p) > room {
			c.buf.Write(p[:room])
		} else {
			c.buf.Write(p)
		}
	}
	return len(p), nil
}
