package internd_test

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/internd"
)

// filters is this process's count of seccomp filters.
func filters(t *testing.T) string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Seccomp_filters:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Skip("this kernel does not report seccomp filters")
	return ""
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
