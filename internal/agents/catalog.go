package agents

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Builtin is the name of Cohort's own agent (`cohort agent`), what an
// intern runs when it names none.
const Builtin = "cohort"

// namePattern is the form of an agent name: it appears in flags, paths and
// error messages.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Catalog is the agents an operator allows interns to run. Users choose a
// name from it; only the operator decides what a name runs.
type Catalog struct {
	// Modules is the node_modules directory the known agents are installed
	// in (`npm install --no-save` in agents/); a known agent is offered when its
	// executable is there.
	Modules string
	// Custom maps further names to commands (argv), ACP over stdio.
	Custom map[string][]string
	// Endpoints overrides a known agent's model API base URL (a company
	// proxy, or a test's scripted server).
	Endpoints map[string]string
	// AuthMethods names, per agent, the ACP authentication method the
	// daemon calls authenticate with when the agent advertises it.
	AuthMethods map[string]string
}

// Names lists what interns may name, sorted: the built-in agent, the known
// agents installed under Modules, and the custom ones.
func (c Catalog) Names() []string {
	names := []string{Builtin}
	for _, p := range All() {
		if c.installed(p) {
			names = append(names, p.Name)
		}
	}
	for n := range c.Custom {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

func (c Catalog) installed(p Profile) bool {
	if c.Modules == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(c.Modules, ".bin", p.Bin))
	return err == nil
}

// Check reports whether an intern may name agent ("" is the built-in one);
// the error lists the names it may.
func (c Catalog) Check(agent string) error {
	if agent == "" || slices.Contains(c.Names(), agent) {
		return nil
	}
	return fmt.Errorf("agent must be one of %s, not %q", strings.Join(c.Names(), ", "), agent)
}

// Resolved is how one intern's agent runs.
type Resolved struct {
	Name string
	// Profile is set for a known agent; Command for a custom one. Neither
	// for the built-in agent.
	Profile *Profile
	Command []string
	// Endpoint is the model API base URL a known agent's requests go to.
	Endpoint string
}

// NotAllowedError is Resolve's refusal of an agent the catalog does not
// hold: an intern created under an earlier catalog whose agent the
// operator has since removed. Its message is the caller's (issue 29).
type NotAllowedError struct{ Agent string }

func (e *NotAllowedError) Error() string {
	return fmt.Sprintf("its agent %q is no longer allowed by the operator (not in the agent catalog)", e.Agent)
}

// Resolve returns how agent runs, or a *NotAllowedError when the catalog
// does not allow it.
func (c Catalog) Resolve(agent string) (Resolved, error) {
	if agent == "" || agent == Builtin {
		return Resolved{Name: Builtin}, nil
	}
	if c.Check(agent) != nil {
		return Resolved{}, &NotAllowedError{Agent: agent}
	}
	if cmd, ok := c.Custom[agent]; ok {
		return Resolved{Name: agent, Command: cmd}, nil
	}
	p, _ := Lookup(agent)
	r := Resolved{Name: agent, Profile: &p, Command: p.Command(c.Modules), Endpoint: p.Provider}
	if e := c.Endpoints[agent]; e != "" {
		r.Endpoint = e
	}
	return r, nil
}

// ParseCustom reads custom agents as "name=command args" entries.
func ParseCustom(entries []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, e := range entries {
		name, cmd, ok := strings.Cut(e, "=")
		name = strings.TrimSpace(name)
		argv := strings.Fields(cmd)
		if !ok || len(argv) == 0 {
			return nil, fmt.Errorf("agent %q: want name=command", e)
		}
		if !namePattern.MatchString(name) || name == Builtin {
			return nil, fmt.Errorf("agent name %q: want lowercase letters, digits and dashes (at most 32), not %q", name, Builtin)
		}
		out[name] = argv
	}
	return out, nil
}

// ParseAuthMethods reads "name=method" entries: the ACP authentication
// method each named agent (known or custom) is authenticated with.
func ParseAuthMethods(entries []string) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range entries {
		name, method, ok := strings.Cut(e, "=")
		if !ok || name == "" || method == "" || strings.ContainsAny(method, " \t\n") {
			return nil, fmt.Errorf("agent auth method %q: want name=method", e)
		}
		out[name] = method
	}
	return out, nil
}

// ParseEndpoints reads "name=URL" entries overriding known agents' model
// API base URLs.
func ParseEndpoints(entries []string) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range entries {
		name, raw, ok := strings.Cut(e, "=")
		if _, known := Lookup(name); !ok || !known {
			return nil, fmt.Errorf("agent endpoint %q: want name=URL with a known agent (%s)", e, strings.Join(KnownNames(), ", "))
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("agent endpoint %q: the URL must be http:// or https:// with a host", e)
		}
		out[name] = strings.TrimRight(raw, "/")
	}
	return out, nil
}

// KnownNames names the known third-party agents: what --agent accepts.
func KnownNames() []string {
	var out []string
	for _, p := range All() {
		out = append(out, p.Name)
	}
	return out
}
