// Package sandbox runs the built-in agent's shell commands, either directly or
// confined in a jail of their own (internal/jail: Cohort's own namespaces,
// no helper binary).
//
// Confined commands see the agent's own file system read-only (inside an
// intern's jail, that is the jail's view), a writable work directory, a
// private writable /tmp, no network (a network namespace with only `lo`)
// and a fresh PID namespace, as uid 1000 of a user namespace of their own
// with no capabilities; they die with the agent. In a gVisor sandbox, whose
// kernel mounts nothing in a user namespace, they enter the read-only view
// the sandbox made for them instead (jail.CommandView, ADR 0985). Both modes bound the
// command's time and the output kept, and run it with an environment
// scrubbed of credentials, so the model never reads the agent's API key
// through the shell.
package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
)

// Defaults for Spec fields left zero.
const (
	DefaultTimeout   = 60 * time.Second
	DefaultMaxOutput = 64 << 10
)

// ErrUnavailable is returned when a confined run is asked for and this
// machine cannot make the jail: the caller must fail closed rather than
// run unconfined.
var ErrUnavailable = errors.New("sandbox unavailable: the command's jail could not be made")

// Spec describes one command.
type Spec struct {
	// Command is run by `sh -c`.
	Command string
	// Dir is the working directory, and the only writable directory when
	// Confined (besides a private /tmp).
	Dir string
	// Confined runs the command in a jail of its own.
	Confined bool
	// Timeout bounds the run; DefaultTimeout when zero.
	Timeout time.Duration
	// MaxOutput bounds the combined stdout and stderr kept; DefaultMaxOutput
	// when zero. The rest is counted and dropped.
	MaxOutput int
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
	// Confined reports that the command ran in its own jail.
	Confined bool
	// Duration is the wall time.
	Duration time.Duration
}

var (
	probeOnce sync.Once
	probeErr  error
)

// Available reports whether confined runs can be made here (checked once).
func Available() bool {
	probeOnce.Do(func() {
		spec := jail.Spec{Inherit: true, UserNS: true}
		if underView() {
			spec = inView(spec, "")
		}
		probeErr = jail.Probe(spec)
	})
	return probeErr == nil
}

// Run runs the command and waits for it. Cancelling ctx kills the command
// and everything it started, and returns ctx's error; a timeout is not an
// error but a Result with TimedOut set, because the model is told about it.
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
	runCtx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	out := &capped{max: s.MaxOutput}
	start := time.Now()
	var (
		code int
		err  error
	)
	if s.Confined {
		code, err = runConfined(runCtx, s, out)
	} else {
		code, err = runDirect(runCtx, s, out)
	}
	res := Result{
		Output:     out.buf.String(),
		TotalBytes: out.total,
		Truncated:  out.total > int64(out.buf.Len()),
		Confined:   s.Confined,
		Duration:   time.Since(start),
		ExitCode:   code,
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if runCtx.Err() != nil {
		res.TimedOut, res.ExitCode = true, -1
		return res, nil
	}
	return res, err
}

func runDirect(ctx context.Context, s Spec, out *capped) (int, error) {
	cmd := exec.CommandContext(ctx, "sh", "-c", s.Command)
	cmd.Dir = s.Dir
	cmd.Env = Environ(os.Environ())
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so a timeout kills what the command started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A background child holding the pipes open must not hold us past the kill.
	cmd.WaitDelay = 2 * time.Second
	// The strict syscall filter: no namespaces, mounts, ptrace, bpf, … for
	// anything the model runs (the agent itself may make jails).
	if err := jail.StartFiltered(cmd, jail.SeccompStrict); err != nil {
		return -1, fmt.Errorf("sandbox: start: %w", err)
	}
	err := cmd.Wait()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) && !errors.Is(err, exec.ErrWaitDelay) {
		return code, fmt.Errorf("sandbox: start: %w", err)
	}
	return code, nil
}

// runConfined runs the command as the program of a nested jail. Killing
// the jail's init ends its PID namespace, and so everything the command
// started.
func runConfined(ctx context.Context, s Spec, out *capped) (int, error) {
	spec, done, err := confinedSpec(s)
	if err != nil {
		return -1, err
	}
	defer done()
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	j, err := jail.Start(spec, jail.Options{Stdout: w, Stderr: w})
	w.Close()
	if err != nil {
		r.Close()
		return -1, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	copied := make(chan struct{})
	go func() {
		io.Copy(out, r)
		close(copied)
	}()
	select {
	case <-j.Done():
	case <-ctx.Done():
		j.Process.Kill()
	}
	st, _ := j.Wait()
	// Every writer is in the jail, which is gone: the pipe drains.
	<-copied
	r.Close()
	code := -1
	if st != nil {
		code = st.ExitCode()
	}
	if code == 126 && bytes.HasPrefix(out.buf.Bytes(), []byte("jail: ")) {
		return code, fmt.Errorf("%w: %s", ErrUnavailable, strings.TrimSpace(out.buf.String()))
	}
	return code, nil
}

// confinedSpec is the jail of one confined command: everything read-only,
// the work directory included (bound again in case it is under /tmp), and
// only a private /tmp takes writes until the caller escalates. done
// removes what was made for it.
func confinedSpec(s Spec) (spec jail.Spec, done func(), err error) {
	spec = jail.Spec{
		Argv: []string{"/bin/sh", "-c", s.Command}, Env: Environ(os.Environ()), Dir: s.Dir,
		Inherit: true, UserNS: true, Hostname: "sandbox",
		Binds: []jail.Bind{{Src: s.Dir, Dst: s.Dir}},
	}
	done = func() {}
	if !underView() {
		return spec, done, nil
	}
	// In a gVisor sandbox's view (ADR 0985) the work directory is there
	// read-only at its own path, or the command cannot run confined; its
	// private /tmp is a directory of the view's /tmp, named by TMPDIR.
	if st, err := os.Stat(filepath.Join(jail.CommandView, s.Dir)); err != nil || !st.IsDir() {
		return spec, done, fmt.Errorf("%w: the work directory %s is not in the sandbox's view of commands", ErrUnavailable, s.Dir)
	}
	tmp, err := os.MkdirTemp(filepath.Join(jail.CommandView, "tmp"), "command-")
	if err != nil {
		return spec, done, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	spec = inView(spec, "/tmp/"+filepath.Base(tmp))
	return spec, func() { os.RemoveAll(tmp) }, nil
}

// inView turns spec into one that enters the gVisor sandbox's view of
// commands (its binds are the view's), with TMPDIR set when tmp is named.
func inView(spec jail.Spec, tmp string) jail.Spec {
	spec.View, spec.Binds = jail.CommandView, nil
	if tmp != "" {
		spec.Env = append(slices.DeleteFunc(spec.Env, func(kv string) bool { return strings.HasPrefix(kv, "TMPDIR=") }), "TMPDIR="+tmp)
	}
	return spec
}

// underView reports that confined commands enter the sandbox's prepared
// view: on gVisor's kernel, where the sandbox made one.
func underView() bool {
	if !jail.UnderGVisor() {
		return false
	}
	st, err := os.Stat(jail.CommandView)
	return err == nil && st.IsDir()
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
