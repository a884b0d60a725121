package provision

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/internd/launch"
)

// AgentRun is how one intern's daemon runs its agent: its part of the
// daemon's launch (where Modules is the node_modules directory a jail must
// show), and for a third-party agent its own model endpoint. Backends that
// start daemons share it.
type AgentRun struct {
	Launch launch.Agent
	// Upstream is a third-party agent's model endpoint ("" for the
	// built-in agent, which uses the gateway's) and KeySecret the vault
	// secret the relay substitutes for the placeholder.
	Upstream, KeySecret string
}

// Agents is the operator's agent settings, shared by the backends that
// start daemons.
type Agents struct {
	// Catalog is the operator's catalog: what an intern's agent name runs.
	Catalog agents.Catalog
	// Command, when set, is passed to daemons as --agent-command: what an
	// intern runs whose agent is the built-in one.
	Command string
	// ModelKey releases an intern's vault secret name for a request to
	// host: the model key of a third-party agent, which the model relay
	// puts in place of the placeholder (vault.Service.Release).
	ModelKey func(ctx context.Context, internID, name, host string) (string, error)
}

// For resolves an intern's agent name through the operator's catalog;
// jailed: behind a model relay that adds the key.
func (a Agents) For(name string, jailed bool) (AgentRun, error) {
	r, err := a.Catalog.Resolve(name)
	if err != nil {
		return AgentRun{}, err
	}
	run, err := a.run(r, jailed)
	if m := a.Catalog.AuthMethods[r.Name]; m != "" && err == nil {
		run.Launch.AuthMethod = m
	}
	return run, err
}

func (a Agents) run(r agents.Resolved, jailed bool) (AgentRun, error) {
	switch {
	case r.Profile != nil:
		run := AgentRun{Upstream: r.Endpoint, KeySecret: r.Profile.KeySecret,
			Launch: launch.Agent{Name: r.Name, Modules: a.Catalog.Modules}}
		if jailed {
			run.Launch.KeyPlaceholder = agents.KeyPlaceholder
		} else {
			// Unjailed there is no relay to add the key: the agent calls its
			// endpoint directly and gets none (docs/agents.md).
			run.Launch.BaseURL = r.Endpoint
		}
		return run, nil
	case len(r.Command) > 0:
		return AgentRun{Launch: launch.Agent{Command: strings.Join(r.Command, " ")}}, nil
	case a.Command != "":
		return AgentRun{Launch: launch.Agent{Command: a.Command}}, nil
	}
	return AgentRun{}, nil
}

// ModelKeyFor is a relay's key lookup for run's own upstream: the intern's
// vault secret KeySecret, released only for the upstream's exact host
// (audited like every release).
func (a Agents) ModelKeyFor(internID string, run AgentRun) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		if run.KeySecret == "" {
			return "", nil
		}
		u, err := url.Parse(run.Upstream)
		if err != nil {
			return "", err
		}
		if a.ModelKey == nil {
			return "", fmt.Errorf("no vault: the intern's %s cannot be looked up", run.KeySecret)
		}
		v, err := a.ModelKey(ctx, internID, run.KeySecret, u.Hostname())
		if err != nil {
			return "", fmt.Errorf("the intern has no vault secret %s released to %s (store it with hosts [%q])", run.KeySecret, u.Hostname(), u.Hostname())
		}
		return v, nil
	}
}
