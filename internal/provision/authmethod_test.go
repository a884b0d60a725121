package provision

import (
	"slices"
	"testing"

	"github.com/cohort-dev/cohort/internal/agents"
)

// The operator's auth method for an agent reaches its daemon's flags, and
// only that agent's.
func TestAgentAuthMethodFlag(t *testing.T) {
	p := &Provisioner{Agents: agents.Catalog{Custom: map[string][]string{"mine": {"/opt/mine"}, "other": {"/opt/other"}},
		AuthMethods: map[string]string{"mine": "api-key"}}}
	run, err := p.agentFor("mine", true)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(run.flags, "--agent-auth-method"); i < 0 || i+1 >= len(run.flags) || run.flags[i+1] != "api-key" {
		t.Fatalf("flags %q lack --agent-auth-method api-key", run.flags)
	}
	run, err = p.agentFor("other", true)
	if err != nil || slices.Contains(run.flags, "--agent-auth-method") {
		t.Fatalf("other agent: %q %v", run.flags, err)
	}
}
