package e2e_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The gvisor backend under the suites the namespace jail passes (ADR 0981):
// the escape attempts, the third round's probe of other processes' memory,
// the quick start's turn and sandboxed command, and gVisor's own kernel
// answering dmesg.

// needRunsc fails where runsc should be (CI installs it: .ci/run) and
// skips, saying so, elsewhere.
func needRunsc(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("runsc (Debian package runsc) is not installed: %v", err)
		}
		t.Skipf("SKIPPING: runsc (Debian package runsc) is not installed: %v", err)
	}
}

func TestEscapeGVisor(t *testing.T) {
	needRunsc(t)
	t.Parallel()
	tg := newTarget(t, "", "--provisioner", "gvisor")
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
	for _, mode := range []string{"self-drive", "manual, escalated"} {
		for _, a := range attempts {
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

// The README's quick start with --provisioner gvisor: the turn streams.
// A command allowed once runs in a jail of its own, which gVisor's kernel
// of this release cannot make (no mount propagation): the call fails,
// nothing runs unconfined; allowed always, it runs in the intern's sandbox
// (ADR 0981).
func TestQuickStartGVisor(t *testing.T) {
	needRunsc(t)
	t.Parallel()
	gw, wk, in := quickStart(t, "--provisioner", "gvisor")
	ask := func() *stream {
		p := readAll(t, chat(t, gw, wk, in, user("$ echo hello from the $((6*7)) sandbox", `"approval_mode":"manual"`)))
		if p.Finish != "tool_calls" {
			t.Fatalf("no pause: %q %s", p.Finish, p.Text)
		}
		return p
	}
	r := readAll(t, chat(t, gw, wk, in, ask().answer("allow_once")))
	if strings.Contains(r.Text, "hello from the 42 sandbox") || !strings.Contains(r.Text, "sandbox unavailable") {
		t.Errorf("after allow_once: %q %q", r.Finish, r.Text)
	}
	r = readAll(t, chat(t, gw, wk, in, ask().answer("allow_always")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "hello from the 42 sandbox") || !strings.Contains(r.Text, `"sandboxed":false`) {
		t.Errorf("after allow_always: %q %q", r.Finish, r.Text)
	}
	if strings.Contains(gw.stderr.String(), "intern daemon exited") {
		t.Errorf("the intern's daemon failed on the way:\n%s", tail(gw.stderr.String(), 3000))
	}
}
