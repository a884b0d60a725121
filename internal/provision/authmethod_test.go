package provision

import (
	"slices"
	"testing"

	"github.com/cohort-dev/cohort/internal/agents"
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
	if i := slices.Index(run.Flags, "--agent-auth-method"); i < 0 || i+1 >= len(run.Flags) || run.Flags[i+1] != "api-key" {
		t.Fatalf("flags %q lack --agent-auth-method api-key", run.Flags)
	}
	run, err = p.For("other", true)
	if err != nil || slices.Contains(run.Flags, "--agent-auth-method") {
		t.Fatalf("other agent: %q %v", run.Flags, err)
	}
}
