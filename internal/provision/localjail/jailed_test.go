package localjail

import (
	"strings"
	"testing"
)

func TestJailConfigCheckRefusesBindsUnderHiddenPaths(t *testing.T) {
	c := JailConfig{Hide: []string{"/srv/cohort", "/opt/cohort/bin"}}
	for _, ok := range []string{"/srv/cohort-agents", "/srv", "/opt/cohort", "/usr/lib/node_modules"} {
		c.ReadOnly = []string{ok}
		if err := c.Check(); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"/srv/cohort", "/srv/cohort/agents", "/opt/cohort/bin/node"} {
		c.ReadOnly = []string{"/usr/local/lib", bad}
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// Each intern's jail user is its own, stable across restarts, and in the
// dedicated range.
func TestJailUID(t *testing.T) {
	a, b := jailUID("2d0f1c1e-0000-4000-8000-000000000001"), jailUID("2d0f1c1e-0000-4000-8000-000000000002")
	if a == b || a != jailUID("2d0f1c1e-0000-4000-8000-000000000001") {
		t.Fatalf("uids %d %d", a, b)
	}
	for _, u := range []int{a, b} {
		if u < 2_000_000_000 || u >= 2_100_000_000 {
			t.Fatalf("uid %d outside the range", u)
		}
	}
}
