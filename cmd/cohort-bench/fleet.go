package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/cohort-dev/cohort/internal/procstat"
	"github.com/cohort-dev/cohort/internal/store"
)

// benchFleet is `cohort-bench fleet`: a real gateway (`cohort serve`, the
// local provisioner, jails unless the machine cannot make them) with many
// sleeping interns, waking some, holding many awake, then shut down.
//
//	cohort-bench fleet [--sleeping 10000] [--awake 200] [--wakes 40] [--cohort PATH]
func benchFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cohort-bench fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sleeping := fs.Int("sleeping", 10000, "interns registered asleep")
	awake := fs.Int("awake", 200, "interns woken and held awake at once")
	wakes := fs.Int("wakes", 40, "turns to a sleeping intern (and as many to an awake one, interleaved)")
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: SQLite in a temporary data directory)")
	unsafe := fs.Bool("unsafe-shared-host", false, "run the interns unjailed (to compare)")
	provisioner := fs.String("provisioner", "local", "local (jails) or gvisor (gVisor sandboxes, runsc)")
	internBin := fs.String("intern-binary", "", "the gateway's --intern-binary: what interns run from (the cohort binary itself, to compare); default: cohort-intern beside the cohort binary if it is there, else the cohort binary")
	_, gvisorServe := gvisorFlags(fs)
	cohortPath := cohortFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sleeping < *awake+*wakes || *awake < 1 || *wakes < 1 {
		return errors.New("fleet: want --awake ≥ 1, --wakes ≥ 1 and --sleeping ≥ --awake + --wakes")
	}
	cohort, dir, err := benchDir(ctx, "fleet", *cohortPath, stderr)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(stdout, "load average at start: %s\n", loadavg())

	serveArgs := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--log-level", "warn",
		"--provisioner", *provisioner, "--intern-idle-timeout", "1h", "--intern-start-concurrency", "8", "--turn-rate", "100000/s"}
	if *dbURL != "" {
		serveArgs = append(serveArgs, "--database-url", *dbURL)
	}
	if *provisioner == "gvisor" {
		serveArgs = append(serveArgs, gvisorServe()...)
	}
	if *internBin != "" {
		serveArgs = append(serveArgs, "--intern-binary", *internBin)
		fmt.Fprintf(stdout, "interns run from: %s\n", *internBin)
	} else if small := filepath.Join(filepath.Dir(cohort), "cohort-intern"); fileExists(small) {
		fmt.Fprintf(stdout, "interns run from: %s (if the same build)\n", small)
	} else {
		fmt.Fprintf(stdout, "interns run from: %s\n", cohort)
	}
	if *unsafe {
		serveArgs = append(serveArgs, "--unsafe-shared-host")
	}
	// The first gateway leaves its jails for the next (a restart); the
	// second stops them when it stops (the shutdown measured last).
	gw := exec.CommandContext(ctx, cohort, append(serveArgs, "--jail-orphan-timeout", "10m")...)
	base, err := startListening(gw, stderr)
	if err != nil {
		return err
	}
	base += "/api/v1"
	stopped := false
	defer func() {
		if !stopped {
			gw.Process.Kill()
			gw.Wait()
		}
	}()
	var boot map[string]string
	b, err := os.ReadFile(filepath.Join(dir, "bootstrap.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &boot); err != nil {
		return err
	}
	wk, demo := boot["workspace_key"], boot["intern_id"]
	if _, err := fleetTurn(ctx, base, wk, demo); err != nil {
		return fmt.Errorf("the demo intern: %w", err)
	}

	// Sleeping interns: rows only, written as the CLI would.
	db, err := store.Open(ctx, *dbURL, dir)
	if err != nil {
		return err
	}
	defer db.Close()
	var tmpl store.Intern
	if err := db.NewSelect().Model(&tmpl).Where("id = ?", demo).Scan(ctx); err != nil {
		return err
	}
	settle := func() { time.Sleep(3 * time.Second) } // sweeps, then a GC cycle or two
	settle()
	before := procstat.PSS(gw.Process.Pid)
	procsBefore := len(procstat.Tree(gw.Process.Pid)) - 1
	ids := make([]string, *sleeping)
	for i := 0; i < *sleeping; i += 500 {
		var rows []store.Intern
		for j := i; j < min(i+500, *sleeping); j++ {
			ids[j] = uuid.NewString()
			rows = append(rows, store.Intern{ID: ids[j], OrganizationID: tmpl.OrganizationID, WorkspaceID: tmpl.WorkspaceID,
				Name: fmt.Sprintf("sleeper-%05d", j), Model: tmpl.Model, State: store.InternSleeping, CreatedBy: tmpl.CreatedBy,
				CreatedAt: time.Now()})
		}
		if _, err := db.NewInsert().Model(&rows).Exec(ctx); err != nil {
			return err
		}
	}
	settle()
	after := procstat.PSS(gw.Process.Pid)
	procsAfter := len(procstat.Tree(gw.Process.Pid)) - 1
	fmt.Fprintf(stdout, "== %d sleeping interns\n", *sleeping)
	fmt.Fprintf(stdout, "gateway PSS %.1f MiB → %.1f MiB: %.0f bytes per sleeping intern (goal ≤ 2048)\n",
		before/(1<<20), after/(1<<20), (after-before)/float64(*sleeping))
	fmt.Fprintf(stdout, "processes under the gateway: %d before, %d after (sleeping interns: %d)\n", procsBefore, procsAfter, procsAfter-procsBefore)

	// Wake latency, interleaved with turns to the awake demo intern.
	var woke, warm []time.Duration
	for i := 0; i < *wakes; i++ {
		d, err := fleetTurn(ctx, base, wk, ids[i])
		if err != nil {
			return fmt.Errorf("wake %d: %w", i, err)
		}
		woke = append(woke, d)
		d, err = fleetTurn(ctx, base, wk, demo)
		if err != nil {
			return fmt.Errorf("awake turn %d: %w", i, err)
		}
		warm = append(warm, d)
	}
	fmt.Fprintf(stdout, "== first chunk of a cohort/demo turn (%d each, interleaved)\n", *wakes)
	fmt.Fprintf(stdout, "sleeping intern (wake included): p50 %s p99 %s (goal p50 ≤ 300ms)\n", percentile(woke, .5).Round(100*time.Microsecond), percentile(woke, .99).Round(100*time.Microsecond))
	fmt.Fprintf(stdout, "awake intern:                    p50 %s p99 %s\n", percentile(warm, .5).Round(100*time.Microsecond), percentile(warm, .99).Round(100*time.Microsecond))

	// Many awake at once: wake them, then every one answers.
	group := ids[*wakes : *wakes+*awake]
	t0 := time.Now()
	if err := eachParallel(group, 16, func(id string) error { _, err := fleetTurn(ctx, base, wk, id); return err }); err != nil {
		return err
	}
	wakeAll := time.Since(t0)
	// turns sends each intern one turn, 16 at a time, counting the answers.
	turns := func(ids []string) (int, error) {
		var answered atomic.Int64
		err := eachParallel(ids, 16, func(id string) error {
			if _, err := fleetTurn(ctx, base, wk, id); err != nil {
				return err
			}
			answered.Add(1)
			return nil
		})
		return int(answered.Load()), err
	}
	answered, err := turns(group)
	if err != nil {
		return err
	}
	tree := procstat.Tree(gw.Process.Pid)
	var internPSS float64
	for _, p := range tree[1:] {
		internPSS += procstat.PSS(p)
	}
	n := *awake + *wakes + 1 // the group, the woken ones, the demo intern
	fmt.Fprintf(stdout, "== %d interns awake\n", n)
	fmt.Fprintf(stdout, "woke %d in %s; %d of %d answered a second turn\n", *awake, wakeAll.Round(time.Millisecond), answered, *awake)
	fmt.Fprintf(stdout, "processes under the gateway: %d; PSS per awake intern %.1f MiB (goal ≤ 10)\n", len(tree)-1, internPSS/float64(n)/(1<<20))
	fmt.Fprintf(stdout, "PSS per awake intern by process (anonymous: heap, stacks, runtime; file: the binary's pages, shared by every process that maps them):\n")
	for _, r := range roleBreakdown(tree[1:]) {
		fmt.Fprintf(stdout, "  %-8s %3d processes, %.2f MiB per intern (anonymous %.2f, file %.2f)\n", r.role, r.procs, r.pss/float64(n)/(1<<20), r.anon/float64(n)/(1<<20), r.file/float64(n)/(1<<20))
	}

	// A restart: the gateway goes (SIGTERM), another starts on the same
	// data and adopts the jails; every intern answers again, from the same
	// processes (unjailed ones are started again instead).
	t0 = time.Now()
	gw.Process.Signal(syscall.SIGTERM)
	gw.Wait()
	down := time.Since(t0)
	t0 = time.Now()
	gw = exec.CommandContext(ctx, cohort, append(serveArgs, "--jail-orphan-timeout", "0")...)
	if base, err = startListening(gw, stderr); err != nil {
		stopped = true
		return err
	}
	base += "/api/v1"
	if answered, err = turns(append(group, demo)); err != nil {
		return fmt.Errorf("after the restart: %w", err)
	}
	alive := 0
	for _, p := range tree[1:] {
		if syscall.Kill(p, 0) == nil {
			alive++
		}
	}
	fmt.Fprintf(stdout, "== restart with %d awake interns: the gateway stopped in %s; the next one answered %d turns in %s; %d of %d intern processes are the same\n",
		n, down.Round(time.Millisecond), answered, time.Since(t0).Round(time.Millisecond), alive, len(tree)-1)

	// Shutdown: SIGTERM until the gateway and every intern's process are gone.
	t0 = time.Now()
	gw.Process.Signal(syscall.SIGTERM)
	gw.Wait()
	stopped = true
	for _, p := range tree[1:] {
		for syscall.Kill(p, 0) == nil && time.Since(t0) < time.Minute {
			time.Sleep(5 * time.Millisecond)
		}
	}
	fmt.Fprintf(stdout, "== shutdown of %d awake interns: %s (goal ≤ 5s)\n", n, time.Since(t0).Round(time.Millisecond))
	fmt.Fprintf(stdout, "load average at end: %s\n", loadavg())
	return nil
}

// startListening starts cmd (the cohort binary: serve, intern) and
// waits for the address it prints first ("listening on URL").
func startListening(cmd *exec.Cmd, stderr io.Writer) (string, error) {
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "listening on "); ok {
			go io.Copy(io.Discard, out)
			return strings.Fields(rest)[0], nil
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	return "", fmt.Errorf("%s exited before listening", filepath.Base(cmd.Args[1]))
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// benchDir is a temporary directory for a load command's children and the
// cohort binary they run (cohortBinary, which may build it there); remove
// the directory when done.
func benchDir(ctx context.Context, name, cohortPath string, stderr io.Writer) (cohort, dir string, err error) {
	if dir, err = os.MkdirTemp("", "cohort-bench-"+name+"-"); err != nil {
		return "", "", err
	}
	// The data directory and the build stay apart: fleet's gateway uses
	// dir itself.
	bin, err := os.MkdirTemp(dir, "bin-")
	if err == nil {
		cohort, err = cohortBinary(ctx, cohortPath, bin, stderr)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return cohort, dir, nil
}

// fleetTurn sends one cohort/demo turn and returns the time to its first
// chunk; it reads the stream to its end.
func fleetTurn(ctx context.Context, base, key, id string) (time.Duration, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/interns/"+id+"/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"hello fleet"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return 0, fmt.Errorf("%d %s", res.StatusCode, b)
	}
	br := bufio.NewReader(res.Body)
	var first time.Duration
	done := false
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") && first == 0 {
			first = time.Since(t0)
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			done = true
		}
		if err != nil {
			break
		}
	}
	if !done {
		return 0, errors.New("the stream ended without [DONE]")
	}
	return first, nil
}

func eachParallel(ids []string, n int, f func(string) error) error {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(id); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("intern %s: %w", id, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// roleMem is the memory of one kind of an intern's processes.
type roleMem struct {
	role            string
	procs           int
	pss, anon, file float64
}

// roleBreakdown sums the PSS of pids by what each process is: the jail's
// init, the daemon, the agent, or anything else (the agent's commands).
func roleBreakdown(pids []int) []roleMem {
	order := []string{"init", "daemon", "agent", "other"}
	by := map[string]*roleMem{}
	for _, r := range order {
		by[r] = &roleMem{role: r}
	}
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		role := "other"
		switch {
		case strings.HasPrefix(argv[0], "cohort-jail-init"):
			role = "init"
		case len(argv) > 1 && argv[1] == "intern":
			role = "daemon"
		case len(argv) > 1 && argv[1] == "agent":
			role = "agent"
		}
		r := by[role]
		r.procs++
		r.pss += procstat.PSS(p)
		r.anon += procstat.Rollup(p, "Pss_Anon:")
		r.file += procstat.Rollup(p, "Pss_File:")
	}
	var out []roleMem
	for _, r := range order {
		if by[r].procs > 0 {
			out = append(out, *by[r])
		}
	}
	return out
}
