package main

import (
	"bufio"
	"cmp"
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
func e2eSyscalls(ctx context.Context, stdout io.Writer, dir, gvStrace string, procs []e2eProc, cnew, ccont *e2eTarget, turns, chunks, streams int, interval time.Duration) error {
	if _, err := exec.LookPath("strace"); err != nil {
		return fmt.Errorf("syscalls phase: %w", err)
	}
	var traced []e2eProc
	for _, p := range procs {
		if p.name == "daemon" || p.name == "agent" {
			traced = append(traced, p)
		}
	}
	var gv *gvisorTrace
	if len(traced) == 0 {
		// Under gVisor the daemon and agent are the Sentry's tasks: their
		// calls are counted from runsc's --strace log, which the gateway's
		// runsc writes through the bench's wrapper (runscStraceWrapper).
		if gvStrace == "" {
			return fmt.Errorf("syscalls phase: no daemon or agent process on the host: use --provisioner local or gvisor")
		}
		gv = &gvisorTrace{dir: gvStrace}
		traced = []e2eProc{{name: "daemon"}, {name: "agent"}}
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
		if gv != nil {
			mark, err := gv.mark()
			if err != nil {
				return r, err
			}
			err = do()
			time.Sleep(500 * time.Millisecond) // the Sentry's log catches up
			if err == nil {
				r.n, err = gv.count(mark)
			}
			return r, err
		}
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
	streams = max(streams, 1)
	r, err := measure("paced stream", 1, func() error {
		// The streams at once, their starts spread over one interval,
		// as the paced phase runs them (a new session each).
		errc := make(chan error, streams)
		for i := range streams {
			go func() {
				time.Sleep(time.Duration(i) * interval / time.Duration(streams))
				n, err := cnew.stream(ctx, benchPrompt(chunks, interval, false))
				if err == nil && n != chunks {
					err = fmt.Errorf("paced stream: %d chunks of %d", n, chunks)
				}
				errc <- err
			}()
		}
		var err error
		for range streams {
			err = cmp.Or(err, <-errc)
		}
		return err
	})
	if err != nil {
		return err
	}
	// Per paced chunk: the streams' calls less a new-session one-chunk
	// turn's each, over the chunks after each stream's first.
	per := result{label: "per paced chunk", per: float64(streams * (chunks - 1)), n: map[string]map[string]int{}}
	for name, m := range r.n {
		per.n[name] = map[string]int{}
		for call, v := range m {
			per.n[name][call] = v
		}
	}
	results = append(results, per)

	fmt.Fprintf(stdout, "\n== system calls and signals of the daemon and the agent (strace; %d turns each, %d streams at once of %d chunks at %v)\n", turns, streams, chunks, interval)
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
		rt := make([]float64, len(results))
		for _, call := range names {
			fmt.Fprintf(stdout, "  %-22s", call)
			for i, r := range results {
				v := float64(r.n[p.name][call])
				if r.label == "per paced chunk" {
					v = (v - float64(streams)*float64(results[1].n[p.name][call])/results[1].per) / r.per
				} else {
					v /= r.per
				}
				if !strings.HasPrefix(call, "SIG") {
					total[i] += v
				}
				if runtimeCalls[call] {
					rt[i] += v
				}
				fmt.Fprintf(stdout, " %18.2f", v)
			}
			fmt.Fprintln(stdout)
		}
		for _, row := range []struct {
			name string
			v    func(i int) float64
		}{
			{"all system calls", func(i int) float64 { return total[i] }},
			{"  of which Go runtime", func(i int) float64 { return rt[i] }},
			{"  the program's own", func(i int) float64 { return total[i] - rt[i] }},
		} {
			fmt.Fprintf(stdout, "  %-22s", row.name)
			for i := range total {
				fmt.Fprintf(stdout, " %18.2f", row.v(i))
			}
			fmt.Fprintln(stdout)
		}
	}
	return nil
}

// runtimeCalls are the calls Go's runtime makes on its own: sysmon's sleeps
// and wake-ups, the scheduler's, threads and memory. The rest (reads,
// writes, polls, files) the program's code asks for.
var runtimeCalls = map[string]bool{
	"futex": true, "nanosleep": true, "sched_yield": true, "restart_syscall": true, "clone": true, "clone3": true,
	"mmap": true, "munmap": true, "mprotect": true, "madvise": true, "rseq": true, "set_robust_list": true,
	"sigaltstack": true, "rt_sigprocmask": true, "rt_sigreturn": true, "gettid": true, "getpid": true, "tgkill": true,
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

// runscStraceWrapper writes a runsc for the gateway (--gvisor-runsc) that
// runs the given one with --debug --strace, its logs in dir: every system
// call of the sandboxed programs, for counting. Measurement only, and the
// bench's own: the logs hold the calls' arguments, the bytes of reads and
// writes in part, so no gateway setting turns it on.
func runscStraceWrapper(runsc, dir string) (string, error) {
	runsc, err := exec.LookPath(runsc)
	if err != nil {
		return "", fmt.Errorf("syscalls phase under gvisor: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	wrapper := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\nexec '" + runsc + "' --debug --debug-log='" + dir + "/' --strace \"$@\"\n"
	return wrapper, os.WriteFile(wrapper, []byte(script), 0o700)
}

// gvisorTrace reads the daemon's and the agent's system calls from runsc's
// --strace log: the newest sandbox's boot log in dir, lines such as
// "[  15:  15] cohort E read(…)", each task's role known from its execve
// ("… intern …" the daemon, "… agent" the agent).
type gvisorTrace struct{ dir string }

type gvisorMark struct {
	file string
	off  int64
}

func (g *gvisorTrace) mark() (gvisorMark, error) {
	files, _ := filepath.Glob(filepath.Join(g.dir, "*.boot.txt"))
	if len(files) == 0 {
		return gvisorMark{}, fmt.Errorf("no runsc boot log in %s", g.dir)
	}
	slices.Sort(files) // named by start time
	f := files[len(files)-1]
	st, err := os.Stat(f)
	if err != nil {
		return gvisorMark{}, err
	}
	return gvisorMark{f, st.Size()}, nil
}

var (
	gvisorLine   = regexp.MustCompile(`\] \[\s*(\d+):\s*\d+\] \S+ ([EX]) ([a-z_0-9]+)\(`)
	gvisorIntern = regexp.MustCompile(`"(intern|agent)"`)
)

// count returns the calls since m by role ("daemon", "agent") and name.
func (g *gvisorTrace) count(m gvisorMark) (map[string]map[string]int, error) {
	f, err := os.Open(m.file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	roles := map[string]string{}
	out := map[string]map[string]int{"daemon": {}, "agent": {}}
	var off int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		off += int64(len(line)) + 1
		mm := gvisorLine.FindSubmatch(line)
		if mm == nil {
			continue
		}
		tgid, call := string(mm[1]), string(mm[3])
		if call == "execve" && mm[2][0] == 'X' {
			if r := gvisorIntern.FindSubmatch(line); r != nil {
				roles[tgid] = map[string]string{"intern": "daemon", "agent": "agent"}[string(r[1])]
			}
		}
		if off <= m.off || mm[2][0] != 'E' {
			continue
		}
		if role := roles[tgid]; role != "" {
			out[role][call]++
		}
	}
	return out, sc.Err()
}
