package e2e_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/testing/gvisortest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The gvisor backend under the suites the namespace jail passes (ADR 0981):
// the escape attempts, the third round's probe of other processes' memory,
// the quick start's turn and sandboxed command, and gVisor's own kernel
// answering dmesg.

// gvisorArgs are a gateway's flags for interns under gVisor: the runsc
// pinned in tools/gvisor (systrap), or the test fails in CI and is skipped
// elsewhere (gvisortest).
func gvisorArgs(t *testing.T, more ...string) []string {
	t.Helper()
	return append([]string{"--provisioner", "gvisor", "--gvisor-runsc", gvisortest.Runsc(t)}, more...)
}

func TestEscapeGVisor(t *testing.T) {
	args := gvisorArgs(t)
	t.Parallel()
	tg := newTarget(t, "", args...)
	// The intern's kernel is gVisor's: its boot log, not the host's.
	if out := tg.run(t, "self-drive", "dmesg | head -1", true); !strings.Contains(out, "Starting gVisor") {
		t.Errorf("dmesg in a gvisor intern:\n%s", tail(out, 2000))
	}
	var attempts []attempt
	for _, a := range tg.attempts {
		switch a.name {
		case "find host paths in /proc/net/unix":
			// The daemon's socket shows, at its path in the sandbox
			// (/run/cohort/daemon); no path of the host does.
			a.success = []string{tg.c.dataDir, "cohort-gvisor-"}
		case procAttempt().name:
			// gVisor has no Landlock: a command may read where the
			// daemon's and the agent's descriptors point (socket:[n],
			// pipe:[n]), never their memory (ADR 0981).
			a.success = []string{"reached-3001", "reached-3002"}
		}
		attempts = append(attempts, a)
	}
	var outputs []string
	for _, mode := range []string{"self-drive", "manual, before escalation", "manual, escalated"} {
		for _, a := range attempts {
			if mode == "manual, before escalation" && (a.name == procAttempt().name || a.name == "use an inherited descriptor") {
				// A confined command's view has no /proc (ADR 0985): these
				// probes find nothing to inspect; what would show success
				// is still looked for.
				a.want = nil
			}
			out := tg.run(t, mode, a.command, true)
			outputs = append(outputs, out)
			a.check(t, mode, out, tg.canaries)
		}
	}
	select {
	case <-tg.gw.done:
		t.Fatal("the gateway died")
	default:
	}
	tg.waitRunning(t, tg.other)
	time.Sleep(200 * time.Millisecond) // the daemons' last log lines
	everything := strings.Join(outputs, "\n") + tg.gw.stderr.String()
	for what, canary := range tg.canaries {
		if what != "sqlite" && strings.Contains(everything, canary) {
			t.Errorf("the %s canary appeared in a stream or log", what)
		}
	}
}

// The README's quick start with --provisioner gvisor: the turn streams,
// and a command allowed once runs confined in the sandbox's view of
// commands (ADR 0985): read-only, the intern's directory included, no
// network, no /proc, a /tmp of its own; allowed always, it runs in the
// intern's sandbox.
//
// It runs on the pinned runsc (systrap) and on Debian's package (ptrace),
// the one `apt-get install runsc` gives a fresh machine.
func TestQuickStartGVisor(t *testing.T) {
	t.Parallel()
	t.Run("pinned", func(t *testing.T) {
		args := gvisorArgs(t)
		t.Parallel()
		quickStartGVisor(t, args)
	})
	t.Run("debian", func(t *testing.T) {
		args := []string{"--provisioner", "gvisor", "--gvisor-runsc", gvisortest.Debian(t)}
		t.Parallel()
		quickStartGVisor(t, args)
	})
}

func quickStartGVisor(t *testing.T, args []string) {
	gw, wk, in := quickStart(t, args...)
	// The intern's kernel is gVisor's: its boot log, not the host's.
	if r := readAll(t, chat(t, gw, wk, in, user("$ dmesg | head -1", `"approval_mode":"self-drive"`))); !strings.Contains(r.Text, "Starting gVisor") {
		t.Errorf("dmesg in a gvisor intern: %q %q", r.Finish, r.Text)
	}
	ask := func(command string) *stream {
		p := readAll(t, chat(t, gw, wk, in, user("$ "+command, `"approval_mode":"manual"`)))
		if p.Finish != "tool_calls" {
			t.Fatalf("no pause: %q %s", p.Finish, p.Text)
		}
		return p
	}
	probe := `echo hello from the $((6*7)) sandbox; touch /intern/confined-probe 2>&1; ` +
		`echo t > $TMPDIR/own && cat $TMPDIR/own | sed s/^/tmp-/; ls /proc 2>/dev/null | grep -c '^[0-9]' | sed s/^/pids-/; ` +
		`hostname changed 2>/dev/null; hostname; ` +
		`python3 -c 'import socket; socket.create_connection(("127.0.0.1", 7101), 2); print("reached" + "-relay")' 2>&1 | tail -1`
	r := readAll(t, chat(t, gw, wk, in, ask(probe).answer("allow_once")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "hello from the 42 sandbox") || !strings.Contains(r.Text, `"sandboxed":true`) {
		t.Fatalf("after allow_once: %q %q", r.Finish, r.Text)
	}
	for _, want := range []string{"Read-only file system", "tmp-t", "pids-0", "\\nsandbox\\n"} {
		if !strings.Contains(r.Text, want) {
			t.Errorf("allow_once: %q missing from %q", want, r.Text)
		}
	}
	if strings.Contains(r.Text, "reached-relay") {
		t.Errorf("a confined command reached the relay: %q", r.Text)
	}
	r = readAll(t, chat(t, gw, wk, in, ask("echo hello from the $((6*7)) sandbox").answer("allow_always")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "hello from the 42 sandbox") || !strings.Contains(r.Text, `"sandboxed":false`) {
		t.Errorf("after allow_always: %q %q", r.Finish, r.Text)
	}
	if strings.Contains(gw.stderr.String(), "intern daemon exited") {
		t.Errorf("the intern's daemon failed on the way:\n%s", tail(gw.stderr.String(), 3000))
	}
}

// The third round's socket-buffer probe under gVisor: a sandbox's TCP
// connections are the Sentry's netstack, inside the sandbox's memory
// cgroup, so filling 250 unread connections moves the host's TCP memory
// by nothing of the intern's; what the intern writes stays within its
// memory limit, or the sandbox is ended at it (ADR 0981).
func TestEscapeSocketBuffersGVisor(t *testing.T) {
	args := gvisorArgs(t, "--log-level", "info", "--intern-memory", "256MiB")
	t.Parallel()
	const limit = 256 << 20
	c, gw := newCluster(t, "", args...)
	tg := &target{c: c, gw: gw}
	tg.waitRunning(t, c.Demo)
	before := hostTCPMem(t)
	peak := before
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			peak = max(peak, hostTCPMem(t))
		}
	}()
	s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+sockFill)))
	close(stop)
	<-done
	out := s.Text
	grew := peak - before
	m := regexp.MustCompile(`filled (\d+) (\d+)`).FindStringSubmatch(out)
	t.Logf("finish %q (%v); the host's TCP memory: %d MiB before, +%d MiB at most; the command: %s", s.Finish, s.Error, before>>20, grew>>20, tail(out, 300))
	if m != nil {
		if written, _ := strconv.ParseInt(m[2], 10, 64); written > limit {
			t.Errorf("%d MiB written into unread connections of an intern limited to %d MiB", written>>20, limit>>20)
		}
	} else {
		// The sandbox was ended at its limit (the host's OOM killer ends
		// the Sentry): the run's stream is severed, and the intern answers
		// again on its next turn.
		if !strings.Contains(fmt.Sprint(s.Error), "stream_severed") {
			t.Fatalf("the command neither filled its connections nor ended its sandbox: %v\n%s", s.Error, tail(out, 2000))
		}
		testutil.Eventually(t, wait, "the intern answers after its sandbox ended", func() bool {
			res := chat(t, gw, c.WK, c.Demo, user("hello again"))
			if res.StatusCode != 200 {
				res.Body.Close()
				return false
			}
			return readAll(t, res).Finish == "stop"
		})
	}
	// Other TCP sockets of the host move the figure: 32 MiB for them.
	if grew > 32<<20 {
		t.Errorf("the host's TCP memory grew by %d MiB while a sandboxed intern filled its connections", grew>>20)
	}
}

// The four third-party agents as interns under gVisor (ADR 0984): node (or
// codex's native binary) under the Sentry, the provider key placed by the
// model relay bridged over a host socket, the agent's own shell tool in
// the sandbox. A text turn, a self-drive command, a manual one allowed
// once and an http_request with a bound secret each; the full matrix runs
// under the namespace jail (TestThirdPartyAgents).
func TestThirdPartyAgentsGVisor(t *testing.T) {
	args := gvisorArgs(t)
	for _, p := range agents.All() {
		t.Run(p.Name, func(t *testing.T) {
			a := newAgentGateway(t, p, args...)
			s := a.turn(t, "cohort-say: hello from gvisor")
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: hello from gvisor") || s.Session == nil {
				for _, turn := range a.model.Turns() {
					t.Logf("model turn: user %q tools %v results %q", turn.User, turn.Tools, turn.ToolResults)
				}
				t.Fatalf("text turn: finish %q text %q session %v error %v\n%s", s.Finish, s.Text, s.Session, s.Error, tail(a.gw.stderr.String(), 4000))
			}
			if keys := a.script.sawKeys(); len(keys) == 0 || keys[len(keys)-1] != a.key {
				t.Fatalf("the model saw keys %v, want the vault's", keys)
			}
			session := `"session_id":` + jsonStr(s.Session.(string))
			s = a.turn(t, "cohort-run: echo c > self.txt && dmesg | head -1 && echo self-4''2", `"approval_mode":"self-drive"`, session)
			if s.Finish == "stop" && strings.Contains(s.Text, "(no output)") {
				// OpenCode's shell tool under gVisor once reported no output
				// of a command that printed (CI, once in four runs): asked
				// again, the command must print.
				t.Logf("self-drive: the agent's tool reported no output; asking again")
				s = a.turn(t, "cohort-run: echo c > self.txt && dmesg | head -1 && echo self-4''2", `"approval_mode":"self-drive"`, session)
			}
			if s.Finish != "stop" || !strings.Contains(s.Text, "self-42") || !strings.Contains(s.Text, "Starting gVisor") {
				t.Fatalf("self-drive: finish %q text %q error %v\n%s", s.Finish, s.Text, s.Error, tail(a.gw.stderr.String(), 4000))
			}
			// manual: the agent's own permission request pauses the run;
			// allowed once, the agent's shell tool runs it in the sandbox
			// (the built-in agent's jail of its own is not involved).
			s = a.turn(t, "cohort-run: echo a > ran.txt && echo ran-4''2", `"approval_mode":"manual"`, session)
			if s.Finish != "tool_calls" || !optionKinds(t, s.Args)["allow_once"] {
				t.Fatalf("manual: want a pause, got finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("allow_once")))
			if s.Finish != "stop" || !strings.Contains(s.Text, "ran-42") {
				t.Fatalf("allow_once: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			// http_request through the daemon's MCP server and the HTTP
			// tool's relay: the bound host gets the secret, the model and
			// the caller its placeholder.
			s = a.turn(t, "cohort-http: /with-secret", `"approval_mode":"self-drive"`, session)
			if s.Finish != "stop" || !strings.Contains(s.Text, "target answered /with-secret") || strings.Contains(s.Text, a.secret) {
				t.Fatalf("http_request: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			if got := a.target.Auth(); len(got) != 1 || got[0] != "Bearer "+a.secret {
				t.Fatalf("the bound host got Authorization %q", got)
			}
		})
	}
}

// relayFlood is a self-drive command: 400 connections to the intern's
// internet relay (127.0.0.1:7103), each sending nothing, held; after a
// moment it counts those the other end closed (refused past the intern's
// cap) and holds the rest a few seconds more while the test looks at the
// gateway.
const relayFlood = `python3 -c 'import socket, time
cs = []
for i in range(400):
    try:
        cs.append(socket.create_connection(("127.0.0.1", 7103), timeout=5))
    except OSError as e:
        print("connect failed", i, e)
        break
time.sleep(3)
closed = 0
for c in cs:
    c.setblocking(False)
    try:
        if c.recv(1) == b"":
            closed += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print("made", len(cs), "closed", closed, flush=True)
time.sleep(5)' 2>&1`

// The third round's relay-connection cap under gVisor: connections to a
// relay port reach the gateway's host socket of that kind through the
// sandbox's init, and are counted against the same per-intern cap
// (egress.DefaultMaxConnsPerIntern) as a jail's: past it they are closed
// and logged, the gateway's descriptors stay bounded, and a neighbour
// keeps answering (ADR 0984).
func TestEscapeRelayCapGVisor(t *testing.T) {
	args := gvisorArgs(t, "--log-level", "info")
	t.Parallel()
	c, gw := newCluster(t, "", args...)
	tg := &target{c: c, gw: gw}
	neighbour := createIntern(t, gw, c.MK, c.WS, "neighbour")
	tg.waitRunning(t, c.Demo)
	tg.waitRunning(t, neighbour)
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", gw.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	peak := before
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			peak = max(peak, fds())
		}
	}()
	var out string
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		out = tg.run(t, "self-drive", relayFlood, true)
	}()
	// While the flood is held, the neighbour answers.
	testutil.Eventually(t, wait, "the flood is held", func() bool {
		return strings.Contains(gw.stderr.String(), "the intern is at its cap")
	})
	if s := readAll(t, chat(t, gw, c.WK, neighbour, user("hello, neighbour"))); s.Finish != "stop" || s.Text == "" {
		t.Errorf("the neighbour during the flood: %q %v", s.Finish, s.Error)
	}
	<-flood
	close(stop)
	<-done
	m := regexp.MustCompile(`made (\d+) closed (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the flood did not run:\n%s", tail(out, 2000))
	}
	made, _ := strconv.Atoi(m[1])
	closed, _ := strconv.Atoi(m[2])
	t.Logf("%d connections made, %d closed by the gateway; the gateway's descriptors: %d before, %d at most", made, closed, before, peak)
	if made != 400 || made-closed > egress.DefaultMaxConnsPerIntern {
		t.Errorf("%d of %d relay connections held open, past the cap of %d", made-closed, made, egress.DefaultMaxConnsPerIntern)
	}
	// One descriptor per held connection on the gateway's side, and some
	// for the rest of the gateway.
	if peak-before > egress.DefaultMaxConnsPerIntern+64 {
		t.Errorf("the gateway's descriptors grew by %d while an intern flooded its relay", peak-before)
	}
}

// The third round's limits under gVisor: one intern's disk fill, /tmp
// fill, CPU burn on every core and 2,000-process fork storm each meet
// their limit in its own stream (RLIMIT_FSIZE, the tmpfs size, the
// sandbox's CPU shares, RLIMIT_NPROC enforced by the Sentry); its memory
// hog ends its whole sandbox at the cgroup's limit (the host's OOM killer
// takes the Sentry) and the intern answers on its next turn. A neighbour's
// turns keep answering throughout (ADR 0981, 0984).
func TestEscapeLimitsGVisor(t *testing.T) {
	args := gvisorArgs(t, "--log-level", "info", "--turn-rate", "10000/m",
		"--intern-memory", "1GiB", "--intern-max-processes", "512", "--intern-disk", "256MiB", "--intern-tmpfs", "64MiB")
	t.Parallel()
	c, gw := newCluster(t, "", args...)
	tg := &target{c: c, gw: gw}
	neighbour := createIntern(t, gw, c.MK, c.WS, "neighbour")
	tg.waitRunning(t, c.Demo)
	tg.waitRunning(t, neighbour)

	var (
		mu    sync.Mutex
		turns []time.Duration
		fails []string
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			start := time.Now()
			s := readAll(t, chat(t, gw, c.WK, neighbour, user("hello, neighbour")))
			d := time.Since(start)
			mu.Lock()
			turns = append(turns, d)
			if s.Finish != "stop" || s.Text == "" || d > 15*time.Second {
				fails = append(fails, fmt.Sprint(s.Finish, " ", d, " ", s.Error))
			}
			mu.Unlock()
		}
	}()

	// Each abuse a turn of its own: where one ends the sandbox, the
	// stream says which.
	var out string
	for _, cmd := range []string{
		`head -c 536870912 /dev/zero > /intern/fill; echo "fill-status-$? fill-size-$(wc -c < /intern/fill)"; rm -f /intern/fill`,
		`head -c 134217728 /dev/zero > /tmp/fill; echo "tmp-status-$?"; rm -f /tmp/fill`,
		`for i in 1 2 3 4; do timeout -s KILL 20 sh -c 'while :; do :; done' & done; echo abuse-$((40+2))`,
	} {
		s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+cmd)))
		t.Logf("%.40s…: finish %q error %v: %s", cmd, s.Finish, s.Error, tail(s.Text, 300))
		out += s.Text
	}
	if !strings.Contains(out, "abuse-42") {
		t.Fatalf("the abuse did not run to its end: %s", tail(out, 3000))
	}
	for _, want := range []struct{ what, s string }{
		{"the disk fill was not stopped at 256 MiB", "fill-size-268435456"},
		{"the /tmp fill was not refused", "No space left on device"},
	} {
		if !strings.Contains(out, want.s) {
			t.Errorf("%s (no %q in the stream)", want.what, want.s)
		}
	}
	// What ends the whole sandbox under gVisor: 2,000 processes past the
	// limit of 512 (the Sentry fails to make a process's host threads,
	// ADR 0984), and 2 GiB held by tail past the sandbox's 1 GiB (the
	// host's OOM killer takes the Sentry). Either the command is refused
	// in its stream, or the stream is severed and the intern answers
	// again on its next turn.
	for _, abuse := range []struct{ what, cmd, refused string }{
		{"the fork storm", `(for i in $(seq 2000); do sleep 15 & done) 2>&1 | grep -c fork; set -- /proc/[0-9]*; echo "procs-$#"`, "procs-"},
		{"the memory hog", `head -c 2147483648 /dev/zero | tail > /dev/null; echo "hog-status-$?"`, "hog-status-"},
	} {
		s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+abuse.cmd)))
		t.Logf("%s: finish %q error %v: %s", abuse.what, s.Finish, s.Error, tail(s.Text, 300))
		switch {
		case strings.Contains(s.Text, "hog-status-0"):
			t.Errorf("2 GiB held in a sandbox limited to 1 GiB")
		case strings.Contains(s.Text, abuse.refused):
			for _, line := range strings.Split(s.Text, `\n`) {
				if n, ok := strings.CutPrefix(line, "procs-"); ok && atoi(n) > 512 {
					t.Errorf("%s processes ran in a sandbox limited to 512", n)
				}
			}
		case !strings.Contains(fmt.Sprint(s.Error), "stream_severed"):
			t.Errorf("%s was neither refused nor ended its sandbox: finish %q error %v", abuse.what, s.Finish, s.Error)
		}
		testutil.Eventually(t, wait, "the abuser answers again after "+abuse.what, func() bool {
			res := chat(t, gw, c.WK, c.Demo, user("hello again"))
			if res.StatusCode != 200 {
				res.Body.Close()
				return false
			}
			return readAll(t, res).Finish == "stop"
		})
	}
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(fails) > 0 {
		t.Errorf("the neighbour noticed: %d of %d turns failed or took over 15 s: %v", len(fails), len(turns), fails)
	}
	if len(turns) < 5 {
		t.Fatalf("the neighbour answered only %d turns during the abuse", len(turns))
	}
	sorted := slices.Clone(turns)
	slices.Sort(sorted)
	t.Logf("the neighbour's %d turns: p50 %v, max %v", len(sorted), sorted[len(sorted)/2], sorted[len(sorted)-1])
	select {
	case <-gw.done:
		t.Fatal("the gateway died")
	default:
	}
}

// Under gVisor the built-in agent calls the model relay's host socket
// itself, not through the sandbox init's bridge (ADR 0986): a model turn
// streams the upstream's answer, the upstream gets the real key in place
// of the placeholder, and the agent says at start which socket it dials.
func TestModelSocketGVisor(t *testing.T) {
	args := gvisorArgs(t, "--log-level", "info")
	t.Parallel()
	key := randomCanary("model-key")
	up := agenttest.NewUpstream(t)
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.GatewayEnv(t, []string{"COHORT_AGENT_BASE_URL=" + up.BaseURL(), "COHORT_AGENT_API_KEY=" + key},
		args...)
	c.load(t)
	in := createInternWith(t, gw, c.MK, `{"workspace_id":"`+c.WS+`","name":"upstream","model":"`+upModel+`"}`)["id"]
	(&target{c: c, gw: gw}).waitRunning(t, in)
	up.Push(agenttest.Answer(upModel, 5, 4, "answered through the socket"))
	s := readAll(t, chat(t, gw, c.WK, in, user("hello")))
	if s.Finish != "stop" || s.Text != "answered through the socket" {
		t.Fatalf("model turn: %q %q %v", s.Finish, s.Text, s.Error)
	}
	for _, auth := range up.Authorizations() {
		if auth != "Bearer "+key {
			t.Errorf("the upstream saw %q", auth)
		}
	}
	if logs := gw.stderr.String(); !strings.Contains(logs, `"model_socket":"/run/cohort/relays/m.sock"`) {
		t.Errorf("the agent does not say it dials the model relay's socket:\n%s", tail(logs, 3000))
	}
}
