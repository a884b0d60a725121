package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohort-dev/cohort/internal/procstat"
)

// gatewaySessions is `cohort-bench sessions --gateway`: a real gateway
// (`cohort serve`, the local provisioner, the demo intern jailed unless
// the machine cannot make jails) takes one-turn chat completions, each in
// a new session, through its REST door; at each count in at, after a
// pause for the sweeps, the resident (RSS) and proportional (PSS) memory
// of the gateway, the jail's init, the daemon and its agent are read from
// /proc, and the gateway's live Go heap from its metrics listener.
func gatewaySessions(ctx context.Context, cohort, dir string, at []int, parallel int, settle time.Duration, stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "load average at start: %s\n", loadavg())
	metricsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	gw := exec.CommandContext(ctx, cohort, "serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--log-level", "warn",
		"--provisioner", "local", "--intern-idle-timeout", "1h", "--turn-rate", "1000000/s", "--metrics-listen", metricsAddr)
	base, err := startListening(gw, stderr)
	if err != nil {
		return err
	}
	defer func() {
		gw.Process.Kill()
		gw.Wait()
	}()
	base += "/api/v1"
	var boot map[string]string
	b, err := os.ReadFile(filepath.Join(dir, "bootstrap.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &boot); err != nil {
		return err
	}
	key, intern := boot["workspace_key"], boot["intern_id"]
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: parallel}}
	turn := func() error {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/interns/"+intern+"/chat/completions",
			strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"hello"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != 200 {
			b, _ := io.ReadAll(res.Body)
			return fmt.Errorf("%d %s", res.StatusCode, b)
		}
		br := bufio.NewReader(res.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: [DONE]") {
				return nil
			}
			if err != nil {
				return errors.New("the stream ended without [DONE]")
			}
		}
	}

	// Warm-up: the jail starts on the first turn; a few more fill the
	// pools (connections, buffers) that any turn uses.
	const warm = 20
	for range warm {
		if err := turn(); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	type row struct {
		n     int
		took  time.Duration
		procs map[string][2]float64 // role → RSS, PSS in bytes
		fds   map[string]int
		heap  float64 // the gateway's heap in use (live and not yet collected)
		gor   float64 // the gateway's goroutines
		other int
	}
	measure := func(n int, took time.Duration) (row, error) {
		time.Sleep(settle)
		r := row{n: n, took: took, procs: map[string][2]float64{}, fds: map[string]int{}}
		for i, p := range procstat.Tree(gw.Process.Pid) {
			role := "gateway"
			if i > 0 {
				role = processRole(p)
			}
			if role == "" {
				r.other++
				continue
			}
			v := r.procs[role]
			r.procs[role] = [2]float64{v[0] + procstat.RSS(p), v[1] + procstat.PSS(p)}
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p))
			r.fds[role] += len(fds)
		}
		m, err := promValues(ctx, "http://"+metricsAddr+"/metrics", "go_memstats_heap_inuse_bytes", "go_goroutines")
		r.heap, r.gor = m[0], m[1]
		return r, err
	}
	rows := []row{}
	r, err := measure(0, 0)
	if err != nil {
		return err
	}
	rows = append(rows, r)
	done := 0
	for _, target := range at {
		var next atomic.Int64
		next.Store(int64(done))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		t0 := time.Now()
		for range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(target) {
					if err := turn(); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		if first != nil {
			return fmt.Errorf("after %d sessions: %w", done, first)
		}
		took := time.Since(t0)
		done = target
		r, err := measure(done, took)
		if err != nil {
			return err
		}
		rows = append(rows, r)
		fmt.Fprintf(stderr, "%d sessions (%s)\n", done, took.Round(time.Second))
	}

	mib := func(v float64) string { return fmt.Sprintf("%.1f", v/(1<<20)) }
	fmt.Fprintf(stdout, "one-turn sessions through the gateway's chat API (%d at once), after %d warm-up turns; figures in MiB, read %s after each count; took: the turns since the previous count\n", parallel, warm, settle)
	fmt.Fprintf(stdout, "%-9s %-9s %-17s %-17s %-17s %-17s %-13s %-11s %-19s %s\n", "sessions", "took", "gateway RSS/PSS", "daemon RSS/PSS", "agent RSS/PSS",
		"jail init RSS/PSS", "gateway heap", "goroutines", "fds gw/daemon/agent", "other processes")
	for _, r := range rows {
		cell := func(role string) string { v := r.procs[role]; return mib(v[0]) + " / " + mib(v[1]) }
		fmt.Fprintf(stdout, "%-9d %-9s %-17s %-17s %-17s %-17s %-13s %-11.0f %-19s %d\n", r.n, r.took.Round(100*time.Millisecond), cell("gateway"),
			cell("daemon"), cell("agent"), cell("init"), mib(r.heap), r.gor, fmt.Sprintf("%d/%d/%d", r.fds["gateway"], r.fds["daemon"], r.fds["agent"]), r.other)
	}
	last, ref := rows[len(rows)-1], rows[0]
	if len(rows) > 2 {
		ref = rows[1] // after warm-up: the first count
	}
	var growth []string
	for _, role := range []string{"gateway", "daemon", "agent", "init"} {
		growth = append(growth, fmt.Sprintf("%s %+.1f", role, (last.procs[role][0]-ref.procs[role][0])/(1<<20)))
	}
	fmt.Fprintf(stdout, "RSS from %d to %d sessions (MiB): %s; gateway heap %+.1f\n", ref.n, last.n, strings.Join(growth, ", "), (last.heap-ref.heap)/(1<<20))
	fmt.Fprintf(stdout, "load average at end: %s\n", loadavg())
	return nil
}

// processRole names a process under the gateway by its command line: the
// daemon (cohort intern), its agent (cohort agent), the jail's init; ""
// for anything else (a command the agent runs).
func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return string(b)
}

func processRole(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	switch {
	case len(args) > 0 && strings.Contains(args[0], "jail-init"):
		return "init"
	case len(b) == 0 && strings.TrimSpace(comm(pid)) == "exe":
		// A gVisor Sentry's ptrace stub (no command line): the sandbox's
		// programs' own instructions run in these.
		return "runsc-stubs"
	case len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "runsc"):
		// A gVisor sandbox: runsc run, runsc-gofer, and runsc-sandbox (the
		// Sentry and its ptrace stubs), where the daemon and agent run.
		return filepath.Base(args[0])
	case len(args) > 1 && args[1] == "intern":
		return "daemon"
	case len(args) > 1 && args[1] == "agent":
		return "agent"
	}
	return ""
}

// promValues reads the named samples (without labels) from a Prometheus
// text page, in the order of names.
func promValues(ctx context.Context, url string, names ...string) ([]float64, error) {
	out := make([]float64, len(names))
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, err
	}
	defer res.Body.Close()
	seen := 0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		for i, name := range names {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				if out[i], err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
					return out, err
				}
				seen++
			}
		}
	}
	if seen != len(names) {
		return out, fmt.Errorf("the gateway's metrics lack one of %s", strings.Join(names, ", "))
	}
	return out, nil
}

// parseCounts reads "1000,10000": increasing positive counts.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || (len(out) > 0 && n <= out[len(out)-1]) {
			return nil, fmt.Errorf("--at %q: want increasing positive counts", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// freeAddr is a loopback address no one listens on, for a child's
// listener that prints no address (a moment's race with other programs
// is acceptable in a benchmark).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
