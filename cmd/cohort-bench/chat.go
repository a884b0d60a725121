package main

import (
	"bufio"
	"bytes"
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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/h2coalesce"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/procstat"
)

// benchPrompt tells the mock model what to stream: n chunks, one every
// interval, then stop (or hold the stream open with hang).
func benchPrompt(n int, interval time.Duration, hang bool) string {
	return fmt.Sprintf("bench n=%d interval=%s hang=%t", n, interval, hang)
}

var benchPromptRE = regexp.MustCompile(`bench n=(\d+) interval=(\S+) hang=(true|false)`)

// mockModel is an OpenAI-compatible chat-completions endpoint whose
// schedule is the last user message (benchPrompt).
func mockModel(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	n, interval, hang := 1, time.Duration(0), false
	for _, m := range req.Messages {
		if s, ok := m.Content.(string); ok && m.Role == "user" {
			if g := benchPromptRE.FindStringSubmatch(s); g != nil {
				n, _ = strconv.Atoi(g[1])
				interval, _ = time.ParseDuration(g[2])
				hang = g[3] == "true"
			}
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	const pre = `data: {"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1,"model":"bench/model","choices":[{"index":0,"delta":`
	start := time.Now()
	for i := range n {
		if interval > 0 {
			// A fixed schedule, not a fixed gap: slow writes do not drift it.
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		}
		if _, err := fmt.Fprintf(w, "%s{\"content\":\"token %06d \"},\"finish_reason\":null}]}\n\n", pre, i); err != nil {
			return
		}
		fl.Flush()
	}
	if hang {
		<-r.Context().Done()
		return
	}
	fmt.Fprintf(w, "%s{},\"finish_reason\":\"stop\"}]}\n\n", pre)
	fmt.Fprint(w, `data: {"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1,"model":"bench/model","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":`+strconv.Itoa(n)+`,"total_tokens":`+strconv.Itoa(n+5)+"}}\n\ndata: [DONE]\n\n")
	fl.Flush()
}

// bareSSE writes the request body as n `data:` events (query n), flushing
// each, then [DONE]; with hang=1 it holds the stream open after them.
func bareSSE(w http.ResponseWriter, r *http.Request) {
	chunk, _ := io.ReadAll(r.Body)
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl := w.(http.Flusher)
	for range n {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
			return
		}
		fl.Flush()
	}
	if r.URL.Query().Get("hang") == "1" {
		<-r.Context().Done()
		return
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// benchChild is a child process of the bench that printed its address.
type benchChild struct {
	cmd *exec.Cmd
	url string
}

// startBenchChild runs bin (the cohort binary, or this one for a mock
// server) with args and waits for the address it prints.
func startBenchChild(bin string, env []string, stderr io.Writer, args ...string) (*benchChild, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if i := strings.Index(sc.Text(), "listening on http://"); i >= 0 && !sent {
				f := strings.Fields(sc.Text()[i+len("listening on "):])
				addr <- f[0]
				sent = true
			}
		}
		if !sent {
			close(addr)
		}
	}()
	select {
	case u, ok := <-addr:
		if !ok {
			cmd.Wait()
			return nil, fmt.Errorf("%v exited before listening", args)
		}
		return &benchChild{cmd: cmd, url: u}, nil
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("%v did not listen", args)
	}
}

func (c *benchChild) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// cpu is the child's CPU time so far (pidCPU).
func (c *benchChild) cpu() time.Duration { return pidCPU(c.cmd.Process.Pid)() }

// namedCPU is a process's CPU time so far, under a name for the output.
type namedCPU struct {
	name string
	cpu  func() time.Duration
}

// childPIDs are the processes pid started (the daemon's agent).
func childPIDs(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// pidCPU returns the process's CPU time so far: the run time of its threads
// (/proc/PID/task/*/schedstat, in nanoseconds), else its user+system time
// in clock ticks of 10 ms (/proc/PID/stat). A Go process keeps its
// threads, so the first misses no thread's time in practice.
func pidCPU(pid int) func() time.Duration {
	return func() time.Duration {
		if d, ok := schedCPU(pid); ok {
			return d
		}
		return statCPU(pid)
	}
}

func statCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// schedCPU sums the run time of the process's threads.
func schedCPU(pid int) (time.Duration, bool) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread ended in between
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}

// rss is the child's resident memory in bytes.
func (c *benchChild) rss() int64 { return int64(procstat.RSS(c.cmd.Process.Pid)) }

// bearer adds the daemon secret to every request.
type bearer struct {
	rt     http.RoundTripper
	header string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.header)
	return b.rt.RoundTrip(r)
}

// benchChat is `cohort-bench chat`: a cohort gateway (serve, the remote
// provisioner, SQLite), one cohort intern daemon with the built-in agent
// before a mock model, the scripted daemon and a bare Go SSE server, each
// its own process; this process is only the client (docs/benchmarks.md,
// Chat).
func benchChat(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cohort-bench chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	turns := fs.Int("turns", 300, "turns measured for time to first chunk, through each path")
	chunks := fs.Int("chunks", 60000, "chunks the model sends on the relay-cost stream")
	bareChunks := fs.Int("bare-chunks", 500000, "chunks the bare SSE server writes for its CPU per chunk")
	streams := fs.Int("streams", 32, "concurrent streams of the throughput run")
	perStream := fs.Int("stream-chunks", 5000, "chunks per stream in the throughput run")
	idle := fs.Int("idle-streams", 10000, "idle streams held open for the memory figure")
	childLogs := fs.Bool("child-logs", false, "show the gateway's, daemon's and agent's logs")
	only := fs.String("only", "", "run only one phase: whole (the gateway before the real daemon) or alone (before the scripted daemon)")
	gwEnv := fs.String("gateway-env", "", "comma-separated KEY=VALUE pairs added to the gateway's environment (GOMAXPROCS=1, GODEBUG=...)")
	profDir := fs.String("profile-dir", "", "write CPU profiles of the gateway (gateway.serve.pprof), the daemon (daemon.intern.pprof) and its agent here")
	cohortPath := cohortFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *only != "" && *only != "whole" && *only != "alone" {
		return fmt.Errorf("chat: --only must be whole or alone, not %q", *only)
	}
	// Every idle stream costs a descriptor in the bench and in each child.
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		fmt.Fprintf(stdout, "RLIMIT_NOFILE %d\n", lim.Cur)
	}
	dir, err := os.MkdirTemp("", "cohort-bench-")
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
	var children []*benchChild
	defer func() {
		for i := len(children) - 1; i >= 0; i-- {
			children[i].stop()
		}
	}()
	logs := io.Discard
	if *childLogs {
		logs = stderr
	}
	child := func(bin string, env []string, args ...string) (*benchChild, error) {
		c, err := startBenchChild(bin, env, logs, args...)
		if err == nil {
			children = append(children, c)
		}
		return c, err
	}

	mock, err := child(self, nil, "mock-model")
	if err != nil {
		return err
	}
	bare, err := child(self, nil, "sse-serve")
	if err != nil {
		return err
	}
	gdir := filepath.Join(dir, "gateway")
	prof := func(name string) []string {
		if *profDir == "" {
			return nil
		}
		return []string{"COHORT_CPUPROFILE=" + filepath.Join(*profDir, name)}
	}
	genv := prof("gateway")
	if *gwEnv != "" {
		genv = append(genv, strings.Split(*gwEnv, ",")...)
	}
	gw, err := child(cohort, genv, "serve", "--listen", "127.0.0.1:0", "--data-dir", gdir, "--provisioner", "remote",
		"--turn-rate", "1000000/s", "--log-level", "error")
	if err != nil {
		return err
	}
	var boot map[string]string
	b, err := os.ReadFile(filepath.Join(gdir, "bootstrap.json"))
	if err != nil {
		return err
	}
	json.Unmarshal(b, &boot)
	intern, key := boot["intern_id"], boot["workspace_key"]
	const secret = "bench-daemon-secret"
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte(secret), 0o600)
	daemon, err := child(cohort, append(prof("daemon"), "COHORT_INTERN_SECRET="+secret, "COHORT_AGENT_BASE_URL="+mock.url+"/v1", "COHORT_AGENT_API_KEY=bench"),
		"intern", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "daemon"), "--intern-id", intern,
		"--model", "bench/model", "--log-level", "error")
	if err != nil {
		return err
	}
	scripted, err := child(self, nil, "mock-daemon")
	if err != nil {
		return err
	}
	// register points the intern at a daemon; the gateway reads the row on
	// every turn, so the next turn goes there.
	register := func(url string) error {
		reg := exec.Command(cohort, "admin", "intern", "register", "--id", intern, "--url", url, "--secret-file", secretFile, "--data-dir", gdir)
		reg.Stderr = stderr
		if err := reg.Run(); err != nil {
			return fmt.Errorf("register: %w", err)
		}
		return nil
	}

	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	// The same transport as the gateway's daemon client, so the daemon-alone
	// reference is not slowed by a second write per call.
	dtr := bearer{&http.Transport{Protocols: &h2c, DialContext: h2coalesce.Dialer((&net.Dialer{}).DialContext)}, "Bearer " + launch.GatewayCredential(secret)}
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0, DisableCompression: true}
	hclient := &http.Client{Transport: tr}
	chatURL := gw.url + "/api/v1/interns/" + intern + "/chat/completions"
	var sessions atomic.Int64

	// direct: one turn on a daemon alone; returns time to the first text.
	direct := func(dclient interndv1connect.InternDaemonServiceClient, prompt string) (time.Duration, error) {
		t0 := time.Now()
		st, err := dclient.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{
			SessionId: fmt.Sprintf("bench-%d", sessions.Add(1)), Prompt: prompt, ApprovalMode: pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE}))
		if err != nil {
			return 0, err
		}
		defer st.Close()
		var first time.Duration
		for st.Receive() {
			if st.Msg().GetEvent().GetText() != nil && first == 0 {
				first = time.Since(t0)
			}
		}
		return first, st.Err()
	}
	// viaGateway: one turn through REST/SSE; onChunk sees every data line.
	viaGateway := func(prompt string, hold bool, onChunk func(line []byte)) (time.Duration, *http.Response, error) {
		body, _ := json.Marshal(map[string]any{"stream": true, "messages": []any{map[string]any{"role": "user", "content": prompt}}})
		req, _ := http.NewRequestWithContext(ctx, "POST", chatURL, strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+key)
		t0 := time.Now()
		res, err := hclient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		if res.StatusCode != 200 {
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			return 0, nil, fmt.Errorf("gateway: %d %s", res.StatusCode, raw)
		}
		br := bufio.NewReaderSize(res.Body, 64<<10)
		var first time.Duration
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				res.Body.Close()
				if errors.Is(err, io.EOF) {
					return first, nil, nil
				}
				return first, nil, err
			}
			if first == 0 && strings.Contains(string(line), `"content"`) {
				first = time.Since(t0)
				if hold {
					return first, res, nil
				}
			}
			if onChunk != nil && len(line) > 6 {
				onChunk(line)
			}
		}
	}
	pct := percentile

	// phase measures, with the intern's daemon at url: time to first chunk,
	// relay cost per chunk and throughput.
	var chunk string // a relayed chunk, for the bare reference and the idle streams
	// others are the processes besides the gateway that a phase's
	// throughput run goes through, for their CPU per model chunk.
	type others func() []namedCPU
	phase := func(title, url string, others others) error {
		if err := register(url); err != nil {
			return err
		}
		dclient := interndv1connect.NewInternDaemonServiceClient(&http.Client{Transport: dtr}, url)
		fmt.Fprintf(stdout, "\n== %s\n", title)

		// 1. Time to the first chunk, the two paths interleaved.
		var dTTFC, gTTFC []time.Duration
		turnCPU0 := gw.cpu()
		for i := range *turns + 20 {
			d, err := direct(dclient, benchPrompt(1, 0, false))
			if err != nil {
				return fmt.Errorf("daemon turn: %w", err)
			}
			g, _, err := viaGateway(benchPrompt(1, 0, false), false, nil)
			if err != nil {
				return err
			}
			if i >= 20 { // warm-up
				dTTFC, gTTFC = append(dTTFC, d), append(gTTFC, g)
			}
		}
		// The gateway's CPU per one-chunk turn (it idles during the daemon's
		// turns): the fixed cost of a turn, taken off the relay figure below.
		perTurn := (gw.cpu() - turnCPU0) / time.Duration(*turns+20)
		fmt.Fprintf(stdout, "time to first chunk (%d turns each)        p50        p99\n", *turns)
		fmt.Fprintf(stdout, "  daemon alone (Connect)          %10v %10v\n", pct(dTTFC, .5), pct(dTTFC, .99))
		fmt.Fprintf(stdout, "  through the gateway (REST/SSE)  %10v %10v\n", pct(gTTFC, .5), pct(gTTFC, .99))
		// What the gateway adds is measured pair by pair: the two turns of a
		// pair ran back to back, so their difference is what the gateway
		// added to that turn. (The difference of the two distributions'
		// percentiles is no such thing, and can even be negative.)
		diffs := make([]time.Duration, len(gTTFC))
		for i := range gTTFC {
			diffs[i] = gTTFC[i] - dTTFC[i]
		}
		fmt.Fprintf(stdout, "  added by the gateway, paired    %10v %10v  (percentiles of the %d differences: each gateway turn minus the daemon turn just before it)\n",
			pct(diffs, .5), pct(diffs, .99), len(diffs))

		// 2. Relay cost per chunk: the gateway's CPU per chunk relayed vs a
		// bare Go SSE server's CPU per identical chunk written.
		var sample []byte
		var got, gotTokens atomic.Int64
		cpu0 := gw.cpu()
		if _, _, err := viaGateway(benchPrompt(*chunks, 0, false), false, func(l []byte) {
			if got.Add(1) == 10 {
				sample = append([]byte(nil), l...)
			}
			gotTokens.Add(int64(bytes.Count(l, []byte("token "))))
		}); err != nil {
			return err
		}
		gwCPU := gw.cpu() - cpu0
		relayed := got.Load()
		chunk = strings.TrimSuffix(strings.TrimPrefix(string(sample), "data: "), "\n")
		cpu0 = bare.cpu()
		// CPU time comes in 10 ms ticks: the bare server writes many chunks so
		// its per-chunk figure is not a rounding artefact.
		res, err := hclient.Post(bare.url+"/?n="+strconv.Itoa(*bareChunks), "application/json", strings.NewReader(chunk))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		bareCPU := bare.cpu() - cpu0
		perGW := float64(gwCPU) / float64(relayed)
		perBare := float64(bareCPU) / float64(*bareChunks)
		// When the agent and the daemon merge deltas, one turn relays few
		// SSE chunks and the turn's own fixed cost weighs on each.
		netGW := float64(max(gwCPU-perTurn, 0)) / float64(relayed)
		fmt.Fprintf(stdout, "relay cost per chunk (CPU of the serving process; sample chunk %d bytes)\n", len(chunk))
		fmt.Fprintf(stdout, "  gateway relay (%7d chunks)   %10v  (%d model chunks: %v per model chunk)\n",
			relayed, time.Duration(perGW), gotTokens.Load(), gwCPU/time.Duration(max(gotTokens.Load(), 1)))
		fmt.Fprintf(stdout, "  less one turn's fixed cost      %10v  (estimate: %v of gateway CPU per one-chunk turn taken off)\n", time.Duration(netGW), perTurn)
		fmt.Fprintf(stdout, "  bare Go SSE write (%7d)      %10v\n  ratio                           %10.2f×  (%.2f× less the fixed cost, an estimate)\n",
			*bareChunks, time.Duration(perBare), perGW/max(perBare, 1), netGW/max(perBare, 1))

		// 3. Throughput: concurrent streams through one gateway. The agent
		// and the daemon merge deltas that arrive together, so a relayed
		// SSE chunk may carry several model chunks ("token NNNNNN "): both
		// are counted.
		var total, tokens atomic.Int64
		var wg sync.WaitGroup
		errc := make(chan error, *streams)
		procs := others()
		procCPU0 := make([]time.Duration, len(procs))
		for i, p := range procs {
			procCPU0[i] = p.cpu()
		}
		cpu0 = gw.cpu()
		t0 := time.Now()
		for range *streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := viaGateway(benchPrompt(*perStream, 0, false), false, func(l []byte) {
					total.Add(1)
					tokens.Add(int64(bytes.Count(l, []byte("token "))))
				}); err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(t0)
		tpCPU := gw.cpu() - cpu0
		select {
		case err := <-errc:
			return err
		default:
		}
		fmt.Fprintf(stdout, "throughput (%d streams × %d chunks, one gateway)\n", *streams, *perStream)
		fmt.Fprintf(stdout, "  model chunks/s end to end       %10.0f  (%d of %d model chunks arrived)\n",
			float64(tokens.Load())/elapsed.Seconds(), tokens.Load(), *streams**perStream)
		fmt.Fprintf(stdout, "  SSE chunks/s end to end         %10.0f  (%.2f model chunks per SSE chunk)\n",
			float64(total.Load())/elapsed.Seconds(), float64(tokens.Load())/float64(max(total.Load(), 1)))
		fmt.Fprintf(stdout, "  gateway CPU per SSE chunk       %10v  (estimate, from CPU time: %.0f SSE chunks/s per core)\n",
			tpCPU/time.Duration(max(total.Load(), 1)), float64(total.Load())/max(tpCPU.Seconds(), 0.01))
		// Where the CPU of the run went, per model chunk: the process
		// with the most is the one that sets the pace (2 cores here).
		perChunk := func(d time.Duration) time.Duration { return d / time.Duration(max(tokens.Load(), 1)) }
		fmt.Fprintf(stdout, "  CPU per model chunk             gateway %v", perChunk(tpCPU))
		for i, p := range procs {
			fmt.Fprintf(stdout, ", %s %v", p.name, perChunk(p.cpu()-procCPU0[i]))
		}
		fmt.Fprintf(stdout, "  (CPU in the run, %v wall)\n", elapsed.Round(time.Millisecond))
		return nil
	}
	// The whole path first (the gateway paced by the agent), then the
	// gateway alone (an upstream that outruns it).
	if *only != "alone" {
		whole := func() []namedCPU {
			ps := []namedCPU{{"daemon", daemon.cpu}}
			for i, pid := range childPIDs(daemon.cmd.Process.Pid) {
				name := "agent"
				if i > 0 {
					name = fmt.Sprintf("agent %d", i+1)
				}
				ps = append(ps, namedCPU{name, pidCPU(pid)})
			}
			return append(ps, namedCPU{"mock model", mock.cpu})
		}
		if err := phase("whole path: gateway → daemon → built-in agent → mock model", daemon.url, whole); err != nil {
			return err
		}
	}
	if *only != "whole" {
		alone := func() []namedCPU { return []namedCPU{{"scripted daemon", scripted.cpu}} }
		if err := phase("gateway alone: gateway → scripted daemon (streams at once)", scripted.url, alone); err != nil {
			return err
		}
	}

	// 4. Memory of idle streams: the gateway's and a bare SSE server's RSS
	// growth per open stream, side by side.
	idleStreams := func(open func() (*http.Response, error), proc *benchChild) (int, int64, []*http.Response, error) {
		base := proc.rss()
		var mu sync.Mutex
		var held []*http.Response
		var firstErr error
		sem := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for range *idle {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				res, err := open()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					return
				}
				held = append(held, res)
			}()
		}
		wg.Wait()
		time.Sleep(2 * time.Second) // let the process settle before reading RSS
		return len(held), proc.rss() - base, held, firstErr
	}
	closeAll := func(rs []*http.Response) {
		for _, r := range rs {
			r.Body.Close()
		}
	}
	itr := &http.Transport{MaxConnsPerHost: 0, DisableKeepAlives: true}
	iclient := &http.Client{Transport: itr}
	n1, grow1, held, err1 := idleStreams(func() (*http.Response, error) {
		_, res, err := viaGateway(benchPrompt(1, 0, true), true, nil)
		return res, err
	}, gw)
	closeAll(held)
	n2, grow2, held, err2 := idleStreams(func() (*http.Response, error) {
		res, err := iclient.Post(bare.url+"/?n=1&hang=1", "application/json", strings.NewReader(chunk))
		if err != nil {
			return nil, err
		}
		br := bufio.NewReader(res.Body)
		if _, err := br.ReadString('\n'); err != nil {
			res.Body.Close()
			return nil, err
		}
		return res, nil
	}, bare)
	closeAll(held)
	fmt.Fprintf(stdout, "\nidle streams (asked %d)                 open   RSS growth   per stream\n", *idle)
	fmt.Fprintf(stdout, "  gateway                         %8d %10.1f MB %9.1f KB\n", n1, float64(grow1)/(1<<20), float64(grow1)/float64(max(n1, 1))/1024)
	fmt.Fprintf(stdout, "  bare Go SSE                     %8d %10.1f MB %9.1f KB\n", n2, float64(grow2)/(1<<20), float64(grow2)/float64(max(n2, 1))/1024)
	if err1 != nil {
		fmt.Fprintf(stdout, "  (gateway: first failure: %v)\n", err1)
	}
	if err2 != nil {
		fmt.Fprintf(stdout, "  (bare: first failure: %v)\n", err2)
	}
	return nil
}

// percentile is the p-quantile (0 < p < 1) of v, nearest rank.
func percentile(v []time.Duration, p float64) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
