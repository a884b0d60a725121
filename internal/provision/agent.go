package provision

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/cohort-dev/cohort/internal/agents"
)

// KeyPlaceholder is the model key agents in a jail send: the model relay
// puts the real one in its place, so the key never enters the jail.
const KeyPlaceholder = "cohort-jail-placeholder-model-key"

// agentRun is how one intern's daemon runs its agent: `cohort intern`
// flags, and for a third-party agent its own model endpoint.
type agentRun struct {
	flags []string
	// upstream is a third-party agent's model endpoint ("" for the
	// built-in agent, which uses the gateway's) and keySecret the vault
	// secret the relay substitutes for the placeholder.
	upstream, keySecret string
	// modules is the node_modules directory the jail must show.
	modules string
}

// agentFor resolves an intern's agent name through the operator's catalog.
func (p *Provisioner) agentFor(name string, jailed bool) (agentRun, error) {
	r, err := p.Agents.Resolve(name)
	if err != nil {
		return agentRun{}, err
	}
	run, err := p.agentRun(r, jailed)
	if m := p.Agents.AuthMethods[r.Name]; m != "" && err == nil {
		run.flags = append(run.flags, "--agent-auth-method", m)
	}
	return run, err
}

func (p *Provisioner) agentRun(r agents.Resolved, jailed bool) (agentRun, error) {
	switch {
	case r.Profile != nil:
		run := agentRun{upstream: r.Endpoint, keySecret: r.Profile.KeySecret, modules: p.Agents.Modules,
			flags: []string{"--agent", r.Name, "--agent-modules", p.Agents.Modules}}
		if jailed {
			run.flags = append(run.flags, "--agent-key-placeholder", KeyPlaceholder)
		} else {
			// Unjailed there is no relay to add the key: the agent calls its
			// endpoint directly and gets none (docs/agents.md).
			run.flags = append(run.flags, "--agent-base-url", r.Endpoint)
		}
		return run, nil
	case len(r.Command) > 0:
		return agentRun{flags: []string{"--agent-command", strings.Join(r.Command, " ")}}, nil
	case p.AgentCommand != "":
		return agentRun{flags: []string{"--agent-command", p.AgentCommand}}, nil
	}
	return agentRun{}, nil
}

// modelKey is a jail's key lookup for its own upstream: the intern's vault
// secret keySecret, released only for the upstream's exact host (audited
// like every release).
func (p *Provisioner) modelKey(internID string, run agentRun) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		if run.keySecret == "" {
			return "", nil
		}
		u, err := url.Parse(run.upstream)
		if err != nil {
			return "", err
		}
		if p.ModelKey == nil {
			return "", fmt.Errorf("no vault: the intern's %s cannot be looked up", run.keySecret)
		}
		v, err := p.ModelKey(ctx, internID, run.keySecret, u.Hostname())
		if err != nil {
			return "", fmt.Errorf("the intern has no vault secret %s released to %s (store it with hosts [%q])", run.keySecret, u.Hostname(), u.Hostname())
		}
		return v, nil
	}
}
