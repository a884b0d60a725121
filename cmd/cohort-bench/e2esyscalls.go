package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// e2eSyscalls is the syscalls phase: the daemon's and the agent's system
// calls (and signals) counted with strace, for one-chunk turns in a
// continued session, in new sessions, and per paced model chunk. Counts
// do not move with the machine's load, unlike the CPU they cost; under
// gVisor's ptrace platform each one is a round trip to the Sentry. Only
// the jailed path (--provisioner local, or remote) has the daemon and
// agent as host processes strace can attach to.
func e2eSyscalls(ctx context.Context, stdout io.Writer, dir string, procs []e2eProc, cnew, ccont *e2eTarget, turns, chunks int, interval time.Duration) error {
	if _, err := exec.LookPath("strace"); err != nil {
		return fmt.Errorf("syscalls phase: %w", err)
	}
	var traced []e2eProc
	for _, p := range procs {
		if p.name == "daemon" || p.name == "agent" {
			traced = append(traced, p)
		}
	}
	if len(traced) == 0 {
		return fmt.Errorf("syscalls phase: no daemon or agent process on the host (use --provisioner local)")
	}
	// Warm both targets, so a continued session exists and each process
	// has its connections and buffers.
	for range 5 {
		for _, t := range []*e2eTarget{ccont, cnew} {
			if _, err := t.turn(ctx, benchPrompt(1, 0, false)); err != nil {
				return err
			}
		}
	}
	type result struct {
		label string
		per   float64
		n     map[string]map[string]int // process → call → count
	}
	measure := func(label string, per float64, do func() error) (result, error) {
		r := result{label: label, per: per, n: map[string]map[string]int{}}
		var stops []func() (map[string]int, error)
		for _, p := range traced {
			stop, err := straceAttach(filepath.Join(dir, fmt.Sprintf("strace.%s.%s", p.name, strings.ReplaceAll(label, " ", "-"))), p.pid)
			if err != nil {
				for _, s := range stops {
					s()
				}
				return r, err
			}
			stops = append(stops, stop)
		}
		err := do()
		// What a process does after the caller's [DONE] belongs to the
		// turn (its journal's sync, the agent's idle): a moment for it.
		time.Sleep(200 * time.Millisecond)
		for i, s := range stops {
			m, serr := s()
			if err == nil {
				err = serr
			}
			r.n[traced[i].name] = m
		}
		return r, err
	}
	var results []result
	for _, c := range []struct {
		label string
		t     *e2eTarget
	}{{"continued turn", ccont}, {"new-session turn", cnew}} {
		r, err := measure(c.label, float64(turns), func() error {
			for range turns {
				if _, err := c.t.turn(ctx, benchPrompt(1, 0, false)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	r, err := measure("paced stream", 1, func() error {
		n, err := cnew.stream(ctx, benchPrompt(chunks, interval, false))
		if err == nil && n != chunks {
			err = fmt.Errorf("paced stream: %d chunks of %d", n, chunks)
		}
		return err
	})
	if err != nil {
		return err
	}
	// Per paced chunk: the stream's calls less a new-session one-chunk
	// turn's, over the chunks after the first.
	per := result{label: "per paced chunk", per: float64(chunks - 1), n: map[string]map[string]int{}}
	for name, m := range r.n {
		per.n[name] = map[string]int{}
		for call, v := range m {
			per.n[name][call] = v
		}
	}
	results = append(results, per)

	fmt.Fprintf(stdout, "\n== system calls and signals of the daemon and the agent (strace; %d turns each, one stream of %d chunks at %v)\n", turns, chunks, interval)
	for _, p := range traced {
		calls := map[string]bool{}
		for _, r := range results {
			for call := range r.n[p.name] {
				calls[call] = true
			}
		}
		names := slices.Sorted(func(yield func(string) bool) {
			for c := range calls {
				if !yield(c) {
					return
				}
			}
		})
		fmt.Fprintf(stdout, "%s:\n%-24s", p.name, "")
		for _, r := range results {
			fmt.Fprintf(stdout, " %18s", r.label)
		}
		fmt.Fprintln(stdout)
		total := make([]float64, len(results))
		for _, call := range names {
			fmt.Fprintf(stdout, "  %-22s", call)
			for i, r := range results {
				v := float64(r.n[p.name][call])
				if r.label == "per paced chunk" {
					v = (v - float64(results[1].n[p.name][call])/results[1].per) / r.per
				} else {
					v /= r.per
				}
				if !strings.HasPrefix(call, "SIG") {
					total[i] += v
				}
				fmt.Fprintf(stdout, " %18.2f", v)
			}
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "  %-22s", "all system calls")
		for _, v := range total {
			fmt.Fprintf(stdout, " %18.2f", v)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

// straceAttach starts strace on pid and all its threads (and threads and
// children it starts), writing the trace to out; it returns once strace
// has attached. The returned stop detaches it and counts the trace's
// system calls by name and its signals (as "SIGURG" and so on).
func straceAttach(out string, pid int) (func() (map[string]int, error), error) {
	cmd := exec.Command("strace", "-f", "-qq", "-e", "signal=all", "-o", out, "-p", strconv.Itoa(pid))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// strace writes nothing when attached with -qq: wait until every
	// thread of pid shows it as its tracer.
	deadline := time.Now().Add(5 * time.Second)
	for !tracedBy(pid, cmd.Process.Pid) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("strace did not attach to %d", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() (map[string]int, error) {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
		return countTrace(out)
	}, nil
}

func tracedBy(pid, tracer int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	want := "TracerPid:\t" + strconv.Itoa(tracer) + "\n"
	for _, t := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if !strings.Contains(string(b), want) {
			return false
		}
	}
	return true
}

var (
	traceCall   = regexp.MustCompile(`^\d+\s+([a-z_0-9]+)\(`)
	traceSignal = regexp.MustCompile(`^\d+\s+--- (SIG[A-Z0-9]+) `)
)

// countTrace counts a strace -f -o file's calls by name (a call strace
// split into "unfinished" and "resumed" lines once) and its signals.
func countTrace(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := traceCall.FindStringSubmatch(line); m != nil {
			n[m[1]]++
		} else if m := traceSignal.FindStringSubmatch(line); m != nil {
			n[m[1]]++
		}
	}
	return n, sc.Err()
}
