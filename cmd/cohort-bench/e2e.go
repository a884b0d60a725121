package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/internal/procstat"
)

// benchE2E is `cohort-bench e2e`: what a caller pays. One OpenAI-style
// model (the mock model, its own process) is called three ways in one
// sitting, request by request in turn: directly; through the whole Cohort
// path (gateway → daemon → built-in agent → model relay → the model); and
// through a peer gateway (Portkey, from npm, pinned in tools/bench-peer).
// Figures: time to first chunk added (new session, continued session),
// CPU per paced model chunk and per one-chunk turn of every process, and
// memory per open paced stream (docs/benchmarks.md, "What a caller pays").
func benchE2E(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cohort-bench e2e", flag.ContinueOnError)
	fs.SetOutput(stderr)
	turns := fs.Int("turns", 200, "one-chunk turns per path for time to first chunk (after 10 warm-up turns each)")
	paced := fs.Int("paced-chunks", 200, "chunks of each paced stream")
	interval := fs.Duration("paced-interval", 10*time.Millisecond, "the model's pace: one chunk per interval")
	streams := fs.Int("paced-streams", 4, "paced streams at once (their starts staggered within one interval)")
	rounds := fs.Int("paced-rounds", 3, "rounds of paced streams, the paths in turn")
	open := fs.Int("open-streams", 100, "paced streams held open for the memory figure (0: skip)")
	openInterval := fs.Duration("open-interval", 100*time.Millisecond, "the pace of the held-open streams")
	provisioner := fs.String("provisioner", "local", "local: the gateway jails the daemon and relays its model calls (root); gvisor: the same in a gVisor sandbox (runsc, root); remote: a cohort intern daemon beside it, the agent calling the model itself")
	peerDir := fs.String("peer-dir", "tools/bench-peer", "the peer gateway's package (npm ci is run there); empty: no peer")
	guard := fs.Bool("guard", false, "print the guard's ratios as Go benchmark lines (.ci/benchguard) and skip the peer and the memory figure")
	profDir := fs.String("profile-dir", "", "write CPU profiles of the gateway (gateway.serve.pprof), the daemon and its agent (daemon.intern.pprof, daemon.agent.pprof) here, over the whole run, and with the open phase each one's memory per open stream in parts (heap, live heap, goroutine stacks) and its heap and goroutine profiles; with --provisioner local only the gateway's (a jailed daemon cannot write here)")
	phases := fs.String("phases", "turns,paced,open", "the phases to run: turns (time to first chunk, CPU per turn), paced (CPU per paced chunk; a turn's fixed cost is taken off only when turns ran too), open (memory per open stream), syscalls (the daemon's and agent's system calls per turn and per paced chunk: with --provisioner local counted with strace, with gvisor from runsc --strace, the gateway's runsc then a wrapper adding --debug --strace; not on by default); one phase with --profile-dir profiles it alone")
	syscallTurns := fs.Int("syscall-turns", 20, "one-chunk turns of each kind the syscalls phase counts over")
	syscallStreams := fs.Int("syscall-streams", 1, "paced streams at once the syscalls phase counts per chunk over")
	syscallDir := fs.String("syscall-dir", "", "keep the syscalls phase's strace output here (strace.PROCESS.WHAT, and runsc-strace/ under gvisor); empty: removed with the run")
	childLogs := fs.Bool("child-logs", false, "show the children's logs")
	floor := fs.Bool("floor", true, "run the floor beside the paths (a bare relay hop and a bare SSE relay hop in front of the model, each its own process) and print every figure as a ratio to it")
	scale := fs.String("scale", "", "the scale phase's stream counts, in order (e.g. 25,50,100,200): N paced streams at once through each path until one fails the bar; empty: no scale phase")
	scaleChunks := fs.Int("scale-chunks", 100, "chunks of each stream of the scale phase")
	scaleInterval := fs.Duration("scale-interval", 20*time.Millisecond, "the model's pace in the scale phase (20ms: 50 tokens/s)")
	scaleRamp := fs.Duration("scale-ramp", time.Second, "the scale phase's streams start spread over this time")
	runsc, gvisorServe := gvisorFlags(fs)
	cohortPath := cohortFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *provisioner != "local" && *provisioner != "gvisor" && *provisioner != "remote" {
		return fmt.Errorf("e2e: --provisioner must be local, gvisor or remote, not %q", *provisioner)
	}
	if *guard {
		*peerDir, *open = "", 0
	}
	e2eOpenProfiles = *profDir
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	fmt.Fprintf(stdout, "load average at start: %s\n", e2eLoad())
	dir, err := os.MkdirTemp("", "cohort-bench-e2e-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cohort, err := cohortBinary(ctx, *cohortPath, dir, stderr)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logs := io.Discard
	if *childLogs {
		logs = stderr
	}
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	mock, err := startBenchChild(self, nil, logs, "mock-model")
	if err != nil {
		return err
	}
	stops = append(stops, mock.stop)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	var floors []*e2eTarget
	var floorProcs []e2eProc
	if *floor {
		var fstops []func()
		floors, floorProcs, fstops, err = floorTargets(self, mock.url, hc, logs)
		if err != nil {
			return err
		}
		stops = append(stops, fstops...)
	}

	// The peer first: its npm ci may take a while, and a missing node is
	// reported before the Cohort processes start.
	var peer *e2ePeer
	if *peerDir != "" {
		peer, err = startPeer(ctx, *peerDir, dir, logs, stderr)
		if err != nil {
			return err
		}
		if peer != nil {
			stops = append(stops, peer.stop)
		}
	}

	run := map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		run[strings.TrimSpace(p)] = true
	}
	var serveArgs []string
	gvStrace := ""
	if *provisioner == "gvisor" {
		if run["syscalls"] {
			gvStrace = filepath.Join(cmp.Or(*syscallDir, dir), "runsc-strace")
			wrapper, err := runscStraceWrapper(*runsc, gvStrace)
			if err != nil {
				return err
			}
			*runsc = wrapper
		}
		serveArgs = gvisorServe()
	}
	c, err := startCohortPath(ctx, cohort, dir, *provisioner, mock.url, *profDir, logs, stderr, serveArgs...)
	if err != nil {
		return err
	}
	stops = append(stops, c.stop)

	direct := &e2eTarget{name: "model directly", url: mock.url + "/v1/chat/completions", hc: hc}
	cnew := &e2eTarget{name: "Cohort, new session", url: c.chatURL, hc: hc, header: http.Header{"Authorization": {"Bearer " + c.key}}}
	ccont := &e2eTarget{name: "Cohort, continued session", url: c.chatURL, hc: hc, header: cnew.header, continued: true}
	targets := append([]*e2eTarget{direct}, floors...)
	targets = append(targets, cnew, ccont)
	if peer != nil {
		targets = append(targets, peer.targets(hc, mock.url)...)
	}
	// The first Cohort turn wakes the intern (a jail starts): not measured.
	// It may still run the demo model (the gateway provisioned the intern
	// before the bench changed its model) or restart the daemon on the
	// change: try until the bench model answers.
	for try := 1; ; try++ {
		_, err := cnew.turn(ctx, benchPrompt(1, 0, false))
		if err == nil {
			break
		}
		if try == 20 {
			return fmt.Errorf("first turn through Cohort: %w", err)
		}
		if *childLogs {
			fmt.Fprintf(stderr, "e2e: first turn through Cohort: %v; again\n", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	procs := c.procs()
	for _, p := range procs {
		if !slices.Contains(cnew.own, p.name) {
			cnew.own = append(cnew.own, p.name)
		}
	}
	ccont.own = cnew.own
	if peer != nil {
		procs = append(procs, e2eProc{"portkey", peer.cmd.Process.Pid}, e2eProc{"portkey-nosleep", peer.nosleep.Process.Pid})
	}
	procs = append(procs, floorProcs...)
	procs = append(procs, e2eProc{"model", mock.cmd.Process.Pid})
	fmt.Fprintf(stdout, "processes: %s\n", e2eProcNames(procs))
	if run["syscalls"] {
		if err := e2eSyscalls(ctx, stdout, cmp.Or(*syscallDir, dir), gvStrace, procs, cnew, ccont, *syscallTurns, *paced, *syscallStreams, *interval); err != nil {
			return err
		}
	}

	// 1. One-chunk turns, the paths in turn, for time to first chunk and
	// CPU per turn. Each process's CPU from one turn's start to the next
	// turn's start is charged to the first (work a process finishes after
	// the caller's [DONE] belongs to its turn).
	const warm = 10
	cpu := make(map[*e2eTarget]map[string]time.Duration)
	for _, t := range targets {
		cpu[t] = map[string]time.Duration{}
	}
	if !run["turns"] {
		*turns = 0
	}
	snap := e2eSnap(procs)
	for i := range *turns + warm*min(*turns, 1) {
		for _, t := range targets {
			ttfc, err := t.turn(ctx, benchPrompt(1, 0, false))
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			next := e2eSnap(procs)
			if i >= warm {
				t.ttfc = append(t.ttfc, ttfc)
				for name, v := range next {
					cpu[t][name] += v - snap[name]
				}
			}
			snap = next
		}
	}
	if *turns > 0 {
		fmt.Fprintf(stdout, "\n== time to first chunk, one-chunk turns (%d per path, paths in turn)\n", *turns)
		fmt.Fprintf(stdout, "%-34s %10s %10s %14s %14s\n", "path", "p50", "p99", "added p50", "added p99")
		for _, t := range targets {
			if t == direct {
				fmt.Fprintf(stdout, "%-34s %10v %10v\n", t.name, us(percentile(t.ttfc, .5)), us(percentile(t.ttfc, .99)))
				continue
			}
			d := make([]time.Duration, len(t.ttfc))
			for i := range d {
				d[i] = t.ttfc[i] - direct.ttfc[i]
			}
			t.added = d
			fmt.Fprintf(stdout, "%-34s %10v %10v %14v %14v\n", t.name, us(percentile(t.ttfc, .5)), us(percentile(t.ttfc, .99)), us(percentile(d, .5)), us(percentile(d, .99)))
		}
		fmt.Fprintf(stdout, "(added: percentiles of the paired differences, each turn minus the direct turn of its round)\n")
		fmt.Fprintf(stdout, "\n== CPU per one-chunk turn, by process\n")
		for _, t := range targets {
			fmt.Fprintf(stdout, "%-34s %s\n", t.name, e2eCPUs(cpu[t], procs, *turns, t.own))
		}
	}

	// 2. Paced streams: one chunk per interval, so nothing can merge; the
	// paths in turn, each round a few streams at once.
	pcpu := make(map[*e2eTarget]map[string]time.Duration)
	pruns := make(map[*e2eTarget]map[string]int64)
	for _, t := range targets {
		pcpu[t] = map[string]time.Duration{}
		pruns[t] = map[string]int64{}
	}
	// A new session per stream: streams at once cannot share one session.
	pacedTargets := append(append([]*e2eTarget{direct}, floors...), cnew)
	if peer != nil {
		pacedTargets = append(pacedTargets, targets[len(targets)-1]) // the peer without its sleep
	}
	if !run["paced"] {
		*rounds = 0
	}
	for range *rounds {
		for _, t := range pacedTargets {
			s0, r0 := e2eSnap(procs), e2eRuns(procs)
			var wg sync.WaitGroup
			errc := make(chan error, *streams)
			for k := range *streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(k) * *interval / time.Duration(*streams))
					n, err := t.stream(ctx, benchPrompt(*paced, *interval, false))
					if err == nil && n != *paced {
						err = fmt.Errorf("%d of %d chunks arrived", n, *paced)
					}
					if err != nil {
						errc <- fmt.Errorf("%s, paced: %w", t.name, err)
					}
				}()
			}
			wg.Wait()
			select {
			case err := <-errc:
				return err
			default:
			}
			time.Sleep(50 * time.Millisecond) // what follows a stream's end is its own
			s1, r1 := e2eSnap(procs), e2eRuns(procs)
			for name, v := range s1 {
				pcpu[t][name] += v - s0[name]
			}
			for name, v := range r1 {
				pruns[t][name] += v - r0[name]
			}
		}
	}
	chunks := *rounds * *streams * *paced
	perChunk := map[*e2eTarget]time.Duration{}
	if chunks > 0 {
		fmt.Fprintf(stdout, "\n== CPU per paced model chunk (%d rounds × %d streams × %d chunks, one per %v), one turn's cost taken off each stream\n",
			*rounds, *streams, *paced, *interval)
		for _, t := range pacedTargets {
			fixed := map[string]time.Duration{}
			for name, v := range cpu[t] {
				fixed[name] = v / time.Duration(max(*turns, 1)) * time.Duration(*rounds**streams)
			}
			per := map[string]time.Duration{}
			for name, v := range pcpu[t] {
				per[name] = max(v-fixed[name], 0) * time.Duration(*paced) / time.Duration(*paced-1)
			}
			fmt.Fprintf(stdout, "%-34s %s\n", t.name, e2eCPUs(per, procs, chunks, t.own))
			sum := time.Duration(0)
			for _, name := range t.own {
				sum += per[name]
			}
			perChunk[t] = sum / time.Duration(chunks)
		}
		fmt.Fprintf(stdout, "\n== threads put on a CPU per paced model chunk (schedstat; wake-ups and preemptions, a turn's share included)\n")
		for _, t := range pacedTargets {
			var parts []string
			total := 0.0
			seen := map[string]bool{}
			for _, p := range procs {
				if seen[p.name] {
					continue // several processes of one name (gVisor's stubs): counted together
				}
				seen[p.name] = true
				v := float64(pruns[t][p.name]) / float64(chunks)
				if slices.Contains(t.own, p.name) {
					total += v
				}
				parts = append(parts, fmt.Sprintf("%s %.2f", p.name, v))
			}
			fmt.Fprintf(stdout, "%-34s path %-6.2f (%s)\n", t.name, total, strings.Join(parts, ", "))
		}
	}
	if len(floors) > 0 {
		fmt.Fprintf(stdout, "\n== ratios to the floor (the same run)\n")
		if chunks > 0 {
			hop, sse := perChunk[floors[0]], perChunk[floors[1]]
			fmt.Fprintf(stdout, "floor per paced chunk: bare relay hop %v, bare SSE relay hop %v\n", us1(hop), us1(sse))
			for _, t := range pacedTargets {
				if t == direct || slices.Contains(floors, t) || hop <= 0 || sse <= 0 {
					continue
				}
				fmt.Fprintf(stdout, "%-34s CPU per paced chunk %v = %.1f × the bare relay hop, %.1f × the bare SSE relay hop\n",
					t.name, us1(perChunk[t]), float64(perChunk[t])/float64(hop), float64(perChunk[t])/float64(sse))
			}
		}
		if *turns > 0 {
			sseAdded := percentile(floors[1].added, .5)
			fmt.Fprintf(stdout, "floor time to first chunk added p50: bare relay hop %v, bare SSE relay hop %v\n", us(percentile(floors[0].added, .5)), us(sseAdded))
			for _, t := range targets {
				if t == direct || slices.Contains(floors, t) || sseAdded <= 0 {
					continue
				}
				a := percentile(t.added, .5)
				fmt.Fprintf(stdout, "%-34s time to first chunk added p50 %v = %.1f × the bare SSE relay hop's\n", t.name, us(a), float64(a)/float64(sseAdded))
			}
		}
	}
	if *guard && chunks > 0 && *turns > 0 {
		// Go benchmark lines (ns/op), for .ci/benchguard's medians.
		modelPer := pcpu[direct]["model"] / time.Duration(chunks)
		fmt.Fprintf(stdout, "BenchmarkE2E/paced_cpu_per_chunk/model 1 %d ns/op\n", modelPer.Nanoseconds())
		fmt.Fprintf(stdout, "BenchmarkE2E/paced_cpu_per_chunk/cohort 1 %d ns/op\n", perChunk[cnew].Nanoseconds())
		fmt.Fprintf(stdout, "BenchmarkE2E/ttfc_p50/model 1 %d ns/op\n", percentile(direct.ttfc, .5).Nanoseconds())
		fmt.Fprintf(stdout, "BenchmarkE2E/ttfc_p50/cohort_continued 1 %d ns/op\n", percentile(ccont.ttfc, .5).Nanoseconds())
		if len(floors) > 0 {
			fmt.Fprintf(stdout, "BenchmarkE2E/paced_cpu_per_chunk/floor_relay 1 %d ns/op\n", perChunk[floors[0]].Nanoseconds())
			fmt.Fprintf(stdout, "BenchmarkE2E/paced_cpu_per_chunk/floor_sse 1 %d ns/op\n", perChunk[floors[1]].Nanoseconds())
			fmt.Fprintf(stdout, "BenchmarkE2E/ttfc_p50/floor_sse 1 %d ns/op\n", percentile(floors[1].ttfc, .5).Nanoseconds())
		}
	}

	// 3. Memory per open paced stream.
	if run["open"] && *open > 0 {
		fmt.Fprintf(stdout, "\n== memory per open paced stream (%d streams, one chunk per %v), RSS growth\n", *open, *openInterval)
		for _, t := range pacedTargets {
			if t == direct {
				continue
			}
			grow, err := e2eOpen(ctx, t, *open, *openInterval, procs)
			if err != nil {
				return err
			}
			var parts []string
			total := 0.0
			for _, name := range t.own {
				parts = append(parts, fmt.Sprintf("%s %.1f KB", name, grow[name]/float64(*open)/1024))
				total += grow[name]
			}
			fmt.Fprintf(stdout, "%-34s %.1f KB per stream (%s)\n", t.name, total/float64(*open)/1024, strings.Join(parts, ", "))
			if *profDir != "" {
				e2eMemParts(stdout, *profDir, *open)
			}
		}
	}
	// 4. Scale: N paced streams at once through each path.
	if *scale != "" {
		// The model directly first: the bar as this machine can meet it.
		scaleTargets := []*e2eTarget{direct}
		if len(floors) > 0 {
			scaleTargets = append(scaleTargets, floors[1])
		}
		scaleTargets = append(scaleTargets, cnew)
		if peer != nil {
			scaleTargets = append(scaleTargets, targets[len(targets)-1])
		}
		perTurn := map[*e2eTarget]time.Duration{}
		for _, t := range scaleTargets {
			for _, name := range t.own {
				if *turns > 0 {
					perTurn[t] += cpu[t][name] / time.Duration(*turns)
				}
			}
		}
		if *turns == 0 {
			perTurn = nil
		}
		if err := e2eScale(ctx, stdout, scaleTargets, procs, perTurn, *scale, *scaleChunks, *scaleInterval, *scaleRamp); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nload average at end: %s\n", e2eLoad())
	return nil
}

// us1 rounds d to a tenth of a microsecond.
func us1(d time.Duration) time.Duration { return d.Round(100 * time.Nanosecond) }

// e2eTarget is one way of calling the model.
type e2eTarget struct {
	name      string
	url       string
	hc        *http.Client
	header    http.Header
	own       []string // the processes of its path (not the model)
	continued bool     // send the last session_id back
	session   string   // the session of a continued target
	turnsIn   int      // turns in that session
	ttfc      []time.Duration
	added     []time.Duration
}

func (t *e2eTarget) request(ctx context.Context, prompt string) (*http.Response, error) {
	body := map[string]any{"model": "bench/model", "stream": true, "messages": []any{map[string]any{"role": "user", "content": prompt}}}
	if t.continued && t.session != "" {
		body["session_id"] = t.session
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", t.url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range t.header {
		req.Header[k] = v
	}
	res, err := t.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != 200 {
		raw, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		res.Body.Close()
		return nil, fmt.Errorf("%d %s", res.StatusCode, raw)
	}
	return res, nil
}

// turn sends prompt and reads the stream to its end; it returns the time
// to the first content chunk.
func (t *e2eTarget) turn(ctx context.Context, prompt string) (time.Duration, error) {
	t0 := time.Now()
	res, err := t.request(ctx, prompt)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var first time.Duration
	var seen bytes.Buffer // what the stream said, for an error
	_, err = t.read(io.TeeReader(res.Body, &seen), func() {
		if first == 0 {
			first = time.Since(t0)
		}
	})
	if err == nil && first == 0 {
		err = fmt.Errorf("no content chunk in %q", seen.String())
	}
	return first, err
}

// stream sends prompt and counts the model's chunks that arrive.
func (t *e2eTarget) stream(ctx context.Context, prompt string) (int, error) {
	res, err := t.request(ctx, prompt)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	return t.read(res.Body, nil)
}

// read reads an SSE stream to [DONE], calling onContent at each line that
// carries model text; it counts the model's tokens ("token NNNNNN") and
// keeps a continued target's session_id.
func (t *e2eTarget) read(body io.Reader, onContent func()) (int, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if bytes.Contains(line, []byte(`"content":"token `)) {
			if onContent != nil {
				onContent()
			}
			n += bytes.Count(line, []byte("token "))
		}
		if t.continued && bytes.Contains(line, []byte(`"session_id"`)) {
			var c struct {
				SessionID string `json:"session_id"`
			}
			if json.Unmarshal(bytes.TrimPrefix(bytes.TrimSpace(line), []byte("data: ")), &c) == nil && c.SessionID != "" {
				if c.SessionID != t.session {
					t.session, t.turnsIn = c.SessionID, 0
				}
				// A continued session's history grows with each turn;
				// a new one every 50 turns keeps the prompt bounded.
				if t.turnsIn++; t.turnsIn >= 50 {
					t.session = ""
				}
			}
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return n, nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, errors.New("the stream ended without [DONE]")
			}
			return n, err
		}
	}
}

// e2eOpenProfiles is --profile-dir: e2eOpen asks each process for its
// memory's parts and profiles (SIGUSR1, see interncmd.Profiled) before and
// while the streams are held.
var e2eOpenProfiles string

// e2eMemParts prints, per stream, what each process's heap (before a
// collection and live after it), goroutine stacks and goroutines grew by
// while the open streams were held: the last two lines of each .mem file
// interncmd.Profiled wrote.
func e2eMemParts(stdout io.Writer, dir string, n int) {
	for _, name := range []string{"gateway.serve", "daemon.intern", "daemon.agent"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".mem"))
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if err != nil || len(lines) < 2 {
			continue
		}
		var v [2][4]float64
		for i, l := range lines[len(lines)-2:] {
			fmt.Sscanf(l, "heap %g live %g stacks %g goroutines %g", &v[i][0], &v[i][1], &v[i][2], &v[i][3])
		}
		per := func(k int) float64 { return (v[1][k] - v[0][k]) / float64(n) }
		fmt.Fprintf(stdout, "  %-14s per stream: heap %.1f KB (live %.1f KB), goroutine stacks %.1f KB, goroutines %.2f\n",
			name, per(0)/1024, per(1)/1024, per(2)/1024, per(3))
	}
}

// e2eSignalProfiles asks the gateway, the daemon and the agent for their
// memory's parts (SIGUSR1, interncmd.Profiled) and gives them a second.
// Only a process whose CPU profile is in dir is profiling and so has the
// handler (a jailed daemon and its agent are not, and SIGUSR1 would end
// them).
func e2eSignalProfiles(procs []e2eProc) {
	profiles := map[string]string{"gateway": "gateway.serve", "daemon": "daemon.intern", "agent": "daemon.agent"}
	for _, p := range procs {
		if name, ok := profiles[p.name]; ok && fileExists(filepath.Join(e2eOpenProfiles, name+".pprof")) {
			syscall.Kill(p.pid, syscall.SIGUSR1)
		}
	}
	time.Sleep(time.Second)
}

// e2eOpen holds n paced streams open through t (each reading), waits for
// the processes to settle and returns their RSS growth in bytes.
func e2eOpen(ctx context.Context, t *e2eTarget, n int, interval time.Duration, procs []e2eProc) (map[string]float64, error) {
	if e2eOpenProfiles != "" {
		e2eSignalProfiles(procs)
	}
	before := map[string]float64{}
	for _, p := range procs {
		before[p.name] = procstat.RSS(p.pid)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The held streams run on a client of their own, so their
	// connections are not left idle in the turns' pool.
	tt := *t
	tt.continued = false
	tt.hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}
	started := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := tt.request(ctx, benchPrompt(1<<30, interval, false))
			if err != nil {
				started <- err
				return
			}
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			sent := false
			for {
				line, err := br.ReadSlice('\n')
				if !sent && bytes.Contains(line, []byte(`"content":"token `)) {
					started <- nil
					sent = true
				}
				if err != nil {
					if !sent {
						started <- err
					}
					return
				}
			}
		}()
	}
	for range n {
		if err := <-started; err != nil {
			return nil, fmt.Errorf("%s, open streams: %w", t.name, err)
		}
	}
	time.Sleep(2 * time.Second)
	grow := map[string]float64{}
	for _, p := range procs {
		grow[p.name] = procstat.RSS(p.pid) - before[p.name]
	}
	if e2eOpenProfiles != "" {
		e2eSignalProfiles(procs)
	}
	cancel()
	wg.Wait()
	time.Sleep(time.Second)
	return grow, nil
}

// e2eProc is one process whose CPU is read.
type e2eProc struct {
	name string
	pid  int
}

func e2eProcNames(procs []e2eProc) string {
	var s []string
	for _, p := range procs {
		s = append(s, fmt.Sprintf("%s %d", p.name, p.pid))
	}
	return strings.Join(s, ", ")
}

// e2eSnap is every process's CPU time so far (schedstat).
func e2eSnap(procs []e2eProc) map[string]time.Duration {
	m := make(map[string]time.Duration, len(procs))
	for _, p := range procs {
		m[p.name] += pidCPU(p.pid)() // a role of several processes (a sandbox's Sentry and its stubs): their sum
	}
	return m
}

// e2eCPUs formats CPU per unit by process, with the sum over the path's own
// processes (not the model) first.
func e2eCPUs(cpu map[string]time.Duration, procs []e2eProc, units int, own []string) string {
	var total time.Duration
	var parts []string
	seen := map[string]bool{}
	for _, p := range procs {
		if seen[p.name] {
			continue
		}
		seen[p.name] = true
		v := cpu[p.name] / time.Duration(units)
		if slices.Contains(own, p.name) {
			total += v
		}
		parts = append(parts, fmt.Sprintf("%s %v", p.name, v.Round(100*time.Nanosecond)))
	}
	return fmt.Sprintf("path %-10v (%s)", total.Round(100*time.Nanosecond), strings.Join(parts, ", "))
}

// cohortPath is a running gateway with its intern's daemon and agent.
type cohortPath struct {
	gw      *exec.Cmd
	daemon  *benchChild // remote only
	chatURL string
	key     string
	stop    func()
}

// startCohortPath starts `cohort serve` (SQLite) with the bench's model as
// the agents' endpoint and points its demo intern at the bench model.
func startCohortPath(ctx context.Context, cohort, dir, provisioner, modelURL, profDir string, logs, stderr io.Writer, serveArgs ...string) (*cohortPath, error) {
	gdir := filepath.Join(dir, "gateway")
	env := []string{"COHORT_AGENT_BASE_URL=" + modelURL + "/v1", "COHORT_AGENT_API_KEY=bench-model-key"}
	gw := exec.Command(cohort, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", gdir, "--provisioner", provisioner,
		"--intern-idle-timeout", "1h", "--jail-orphan-timeout", "0", "--turn-rate", "1000000/s", "--log-level", "error"}, serveArgs...)...)
	gw.Env = append(os.Environ(), env...)
	if profDir != "" {
		gw.Env = append(gw.Env, "COHORT_CPUPROFILE="+filepath.Join(profDir, "gateway"))
	}
	gw.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	base, err := startListening(gw, logs)
	if err != nil {
		return nil, err
	}
	c := &cohortPath{gw: gw}
	c.stop = func() {
		gw.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { gw.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			gw.Process.Kill()
			<-done
		}
		if c.daemon != nil {
			c.daemon.stop()
		}
	}
	var boot map[string]string
	b, err := os.ReadFile(filepath.Join(gdir, "bootstrap.json"))
	if err == nil {
		err = json.Unmarshal(b, &boot)
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	intern := boot["intern_id"]
	c.key = boot["workspace_key"]
	c.chatURL = base + "/api/v1/interns/" + intern + "/chat/completions"
	admin := func(args ...string) error {
		cmd := exec.CommandContext(ctx, cohort, append([]string{"admin"}, append(args, "--data-dir", gdir)...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cohort admin %s: %w\n%s", strings.Join(args[:2], " "), err, out)
		}
		return nil
	}
	if err := admin("intern", "update", "--org", boot["organization_id"], "--id", intern, "--model", "bench/model"); err != nil {
		c.stop()
		return nil, err
	}
	if provisioner == "remote" {
		const secret = "bench-daemon-secret"
		secretFile := filepath.Join(dir, "secret")
		os.WriteFile(secretFile, []byte(secret), 0o600)
		denv := append(env, "COHORT_INTERN_SECRET="+secret)
		if profDir != "" {
			denv = append(denv, "COHORT_CPUPROFILE="+filepath.Join(profDir, "daemon"))
		}
		d, err := startBenchChild(cohort, denv, logs,
			"intern", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "daemon"), "--intern-id", intern,
			"--model", "bench/model", "--log-level", "error")
		if err != nil {
			c.stop()
			return nil, err
		}
		c.daemon = d
		if err := admin("intern", "register", "--id", intern, "--url", d.url, "--secret-file", secretFile); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

// procs are the path's processes: the gateway, the jail's init (local),
// the daemon and its agent.
func (c *cohortPath) procs() []e2eProc {
	out := []e2eProc{{"gateway", c.gw.Process.Pid}}
	pids := procstat.Tree(c.gw.Process.Pid)[1:]
	if c.daemon != nil {
		pids = append(pids, procstat.Tree(c.daemon.cmd.Process.Pid)...)
	}
	for _, pid := range pids {
		if role := processRole(pid); role != "" {
			out = append(out, e2eProc{role, pid})
		}
	}
	return out
}

// e2ePeer is the peer gateway (Portkey) and its patched twin.
type e2ePeer struct {
	cmd, nosleep *exec.Cmd
	url, url2    string
}

func (p *e2ePeer) stop() {
	for _, c := range []*exec.Cmd{p.cmd, p.nosleep} {
		if c != nil && c.Process != nil {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}
}

// targets are the peer as shipped and without its first-chunk sleep.
func (p *e2ePeer) targets(hc *http.Client, modelURL string) []*e2eTarget {
	h := http.Header{"X-Portkey-Provider": {"openai"}, "X-Portkey-Custom-Host": {modelURL + "/v1"}, "Authorization": {"Bearer bench-model-key"}}
	return []*e2eTarget{
		{name: "Portkey as shipped", url: p.url + "/v1/chat/completions", hc: hc, header: h, own: []string{"portkey"}},
		{name: "Portkey without its 25 ms sleep", url: p.url2 + "/v1/chat/completions", hc: hc, header: h, own: []string{"portkey-nosleep"}},
	}
}

// portkeySleep is the first-chunk sleep of @portkey-ai/gateway 1.15.2's
// stream handler (build/start-server.js): before the first event of an
// upstream stream it awaits setTimeout(e,25).
const portkeySleep = "await new Promise((e=>setTimeout(e,25)))"

// startPeer installs the pinned peer (npm ci) and starts it twice: as
// shipped, and a copy of its server script with the 25 ms first-chunk
// sleep taken out. Without node or npm it returns nil and says so.
func startPeer(ctx context.Context, pkgDir, dir string, logs, stderr io.Writer) (*e2ePeer, error) {
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		fmt.Fprintln(stderr, "e2e: node or npm is not on PATH: the peer gateway (Portkey) is skipped")
		return nil, nil
	}
	abs, err := filepath.Abs(pkgDir)
	if err != nil {
		return nil, err
	}
	script := filepath.Join(abs, "node_modules/@portkey-ai/gateway/build/start-server.js")
	if _, err := os.Stat(script); err != nil {
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = abs
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("npm ci in %s: %w\n%s", pkgDir, err, out)
		}
	}
	src, err := os.ReadFile(script)
	if err != nil {
		return nil, err
	}
	if bytes.Count(src, []byte(portkeySleep)) != 1 {
		return nil, fmt.Errorf("%s: the first-chunk sleep %q is not there once: another version of the peer?", script, portkeySleep)
	}
	// The copy sits beside the original, so its imports resolve the same.
	patched := filepath.Join(filepath.Dir(script), "start-server-nosleep.js")
	if err := os.WriteFile(patched, bytes.Replace(src, []byte(portkeySleep), []byte("void 0"), 1), 0o644); err != nil {
		return nil, err
	}
	p := &e2ePeer{}
	start := func(path string) (*exec.Cmd, string, error) {
		addr, err := freeAddr()
		if err != nil {
			return nil, "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		// shim.mjs: see there (Node 20 and the peer's header handling).
		cmd := exec.Command(node, "--import", filepath.Join(abs, "shim.mjs"), path, "--port="+port, "--headless")
		// production: no log UI routes; the peer logs nothing per request.
		cmd.Env = append(os.Environ(), "NODE_ENV=production")
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			return nil, "", err
		}
		url := "http://127.0.0.1:" + port
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if res, err := http.Get(url + "/"); err == nil {
				res.Body.Close()
				if res.StatusCode == 200 {
					return cmd, url, nil
				}
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
		return nil, "", fmt.Errorf("the peer gateway (%s) did not answer on %s", path, url)
	}
	if p.cmd, p.url, err = start(script); err != nil {
		return nil, err
	}
	if p.nosleep, p.url2, err = start(patched); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// us rounds d to the microsecond, for the tables.
func us(d time.Duration) time.Duration { return d.Round(time.Microsecond) }

// e2eLoad is the load average (1, 5, 15 minutes).
func e2eLoad() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
