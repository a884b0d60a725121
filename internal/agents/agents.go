// Package agents knows how to run the third-party Agent Client Protocol
// agents Cohort supports as interns (Claude, Codex, OpenCode, Gemini CLI):
// which pinned npm package and command each is, which model API it speaks,
// and how to point it at a model endpoint and key without anything else
// (no login, no telemetry, no update check). docs/agents.md has the
// compatibility matrix.
package agents

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// KeyPlaceholder is the model key agents in a jail or Pod send: the model
// relay puts the real one in its place, so the key never enters either.
const KeyPlaceholder = "cohort-jail-placeholder-model-key"

// Profile is how to run one agent.
type Profile struct {
	// Name is what an intern record names: "claude", "codex", …
	Name string
	// Package and Version are the pinned npm package (agents/package.json).
	Package, Version string
	// Bin is the executable under node_modules/.bin; Args follow it.
	Bin  string
	Args []string
	// Protocol is the model API the agent calls (modelserver.Anthropic, …).
	Protocol string
	// Provider is the model API's public base URL, the default endpoint.
	Provider string
	// Model is the model asked for when the intern names none of its own
	// (its model is Cohort's demo model, which only the built-in agent runs).
	Model string
	// KeySecret is the name of the vault secret holding the provider key
	// (bound to the endpoint's host): the relay puts it in place of the
	// placeholder the agent sends.
	KeySecret string
	// Setup returns the environment and the files (path relative to
	// s.Home → content) that point the agent at s.BaseURL with s.Key.
	Setup func(s Setup) (env []string, files map[string]string)
}

// Setup is what an agent is pointed at.
type Setup struct {
	// BaseURL is the model API's base URL as the agent must call it (the
	// jail's model relay, or a test's scripted server).
	BaseURL string
	// Key is the API key the agent sends; in a jail a placeholder the
	// relay replaces.
	Key string
	// Model is the model name to ask for.
	Model string
	// Home is the agent's home directory (HOME), writable.
	Home string
}

var profiles []Profile

func register(p Profile) { profiles = append(profiles, p) }

// All returns every known profile, by name.
func All() []Profile {
	out := slices.Clone(profiles)
	slices.SortFunc(out, func(a, b Profile) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Lookup returns the profile called name.
func Lookup(name string) (Profile, bool) {
	for _, p := range profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// Command is the agent's argv when its packages are installed under
// modules (a node_modules directory).
func (p Profile) Command(modules string) []string {
	return append([]string{filepath.Join(modules, ".bin", p.Bin)}, p.Args...)
}

// Install writes the agent's files under s.Home (created) and returns its
// environment, HOME included. An empty s.Model, or Cohort's demo model,
// asks for the profile's own.
func (p Profile) Install(s Setup) ([]string, error) {
	if s.Model == "" || strings.HasPrefix(s.Model, "cohort/") {
		s.Model = p.Model
	}
	if err := os.MkdirAll(s.Home, 0o700); err != nil {
		return nil, err
	}
	env, files := p.Setup(s)
	for rel, content := range files {
		path := filepath.Join(s.Home, filepath.FromSlash(rel))
		if !strings.HasPrefix(path, filepath.Clean(s.Home)+string(filepath.Separator)) {
			return nil, fmt.Errorf("agent %s: file %q is outside its home", p.Name, rel)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	return append([]string{"HOME=" + s.Home}, env...), nil
}

func (p Profile) String() string { return fmt.Sprintf("%s (%s@%s)", p.Name, p.Package, p.Version) }
