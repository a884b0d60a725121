package main

import (
	"flag"
	"strings"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
)

// agentFlags registers the catalog of agents interns may name. The admin
// CLI reads the same variables, so that it validates as serve does.
func agentFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.AgentModules, "agent-modules", env("COHORT_AGENT_MODULES", ""), "node_modules directory of the third-party agents interns may run (npm install --no-save in agents/): "+strings.Join(agents.KnownNames(), ", ")+" (COHORT_AGENT_MODULES; docs/agents.md)")
	cfg.Agents = splitEntries(env("COHORT_AGENTS", ""))
	fs.Func("agent", "a custom ACP agent interns may run, name=command (repeatable; COHORT_AGENTS, entries separated by ';')", func(v string) error {
		cfg.Agents = append(cfg.Agents, v)
		return nil
	})
	cfg.AgentEndpoints = splitEntries(env("COHORT_AGENT_ENDPOINTS", ""))
	fs.Func("agent-endpoint", "name=URL: the model API a known agent's requests go to instead of its provider's (repeatable; COHORT_AGENT_ENDPOINTS, entries separated by ';')", func(v string) error {
		cfg.AgentEndpoints = append(cfg.AgentEndpoints, v)
		return nil
	})
	cfg.AgentAuthMethods = splitEntries(env("COHORT_AGENT_AUTH_METHODS", ""))
	fs.Func("agent-auth-method", "name=method: the ACP authentication method an agent is authenticated with before any session, when it advertises it (repeatable; COHORT_AGENT_AUTH_METHODS, entries separated by ';')", func(v string) error {
		cfg.AgentAuthMethods = append(cfg.AgentAuthMethods, v)
		return nil
	})
}

func splitEntries(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ";") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
