package provision

import (
	"slices"
	"testing"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/internd/launch"
)

// The operator's auth method for an agent reaches its daemon's flags, and
// only that agent's.
func TestAgentAuthMethodFlag(t *testing.T) {
	p := Agents{Catalog: agents.Catalog{Custom: map[string][]string{"mine": {"/opt/mine"}, "other": {"/opt/other"}},
		AuthMethods: map[string]string{"mine": "api-key"}}}
	run, err := p.For("mine", true)
	if err != nil {
		t.Fatal(err)
	}
	flags := launch.Daemon{Agent: run.Launch}.Args()
	if i := slices.Index(flags, "--agent-auth-method"); i < 0 || i+1 >= len(flags) || flags[i+1] != "api-key" {
		t.Fatalf("flags %q lack --agent-auth-method api-key", flags)
	}
	run, err = p.For("other", true)
	if flags := (launch.Daemon{Agent: run.Launch}.Args()); err != nil || slices.Contains(flags, "--agent-auth-method") {
		t.Fatalf("other agent: %q %v", flags, err)
	}
}
