package internd_test

import (
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/internd"
)

// filters is the count of seccomp filters of a plain child of this
// process (this process's own threads differ: one that forked under
// StartFiltered may be the main thread, which the runtime parks for good
// instead of ending it).
func filters(t *testing.T) string {
	out, err := exec.Command("grep", "Seccomp_filters:", "/proc/self/status").Output()
	if err != nil {
		t.Skipf("this kernel does not report seccomp filters: %v", err)
	}
	return strings.TrimSpace(strings.TrimPrefix(string(out), "Seccomp_filters:"))
}

// An agent other than the built-in one starts under one more syscall
// filter than the daemon has (the strict one); the built-in agent, which
// filters its own commands and makes jails for manual mode, does not.
func TestThirdPartyAgentIsFiltered(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("seccomp is Linux's")
	}
	t.Parallel()
	own := filters(t)
	for _, nests := range []bool{false, true} {
		e := newEnv(t, func(c *internd.Config) { c.AgentNests = nests })
		evs, err := e.start(t, "s", "seccomp", selfDrive)
		mustOK(t, err)
		got := text(evs)
		if nests && got != own {
			t.Errorf("the built-in agent has %s filters, the daemon %s", got, own)
		}
		if !nests && got == own {
			t.Errorf("a third-party agent has the daemon's %s filters: not filtered", got)
		}
	}
}
