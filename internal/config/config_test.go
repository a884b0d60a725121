package config

import (
	"flag"
	"strings"
	"testing"
)

func TestSplitList(t *testing.T) {
	t.Parallel()
	got := SplitList(" eu.api.example.com, ,us.api.example.com,")
	if strings.Join(got, "|") != "eu.api.example.com|us.api.example.com" {
		t.Fatalf("%q", got)
	}
}

// A flag's variable is named from the flag alone; the helpers read it as
// the default and name it in the usage.
func TestFlagVariables(t *testing.T) {
	t.Setenv("COHORT_INTERN_IDLE_TIMEOUT", "5m")
	t.Setenv("COHORT_AGENTS", "a=x; ;b=y")
	t.Setenv("COHORT_REGIONAL_HOSTS", "eu.example.com,,us.example.com")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	idle := String(fs, "intern-idle-timeout", "10m", "idle")
	var agents, regional []string
	RepeatedVar(fs, &agents, "agent", "agents")
	ListVar(fs, &regional, "regional-hosts", "hosts")
	if *idle != "5m" || strings.Join(agents, "|") != "a=x|b=y" || strings.Join(regional, "|") != "eu.example.com|us.example.com" {
		t.Fatalf("from the variables: %q %q %q", *idle, agents, regional)
	}
	if u := fs.Lookup("intern-idle-timeout").Usage; u != "idle (COHORT_INTERN_IDLE_TIMEOUT)" {
		t.Errorf("usage %q", u)
	}
	if u := fs.Lookup("agent").Usage; !strings.Contains(u, "COHORT_AGENTS") {
		t.Errorf("usage %q", u)
	}
	if err := fs.Parse([]string{"--agent", "c=z", "--regional-hosts", "x.example.com"}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(agents, "|") != "a=x|b=y|c=z" || strings.Join(regional, "|") != "x.example.com" {
		t.Fatalf("a repeated flag adds to its variable's entries, a list replaces them: %q %q", agents, regional)
	}
	if Setting("turn-rate") != "--turn-rate (COHORT_TURN_RATE)" {
		t.Errorf("Setting: %q", Setting("turn-rate"))
	}
}

// Validate names the flag of the setting that is wrong.
func TestValidate(t *testing.T) {
	t.Parallel()
	for flag, change := range map[string]func(*Config){
		"--cors-allow-origins":     func(c *Config) { c.Server.CORSAllowOrigins = []string{"*"} },
		"--federation-allow-hosts": func(c *Config) { c.Federation.AllowHosts = []string{"10.0.0.0/40"} },
		"--webhook-allow-hosts":    func(c *Config) { c.Webhooks.AllowHosts = []string{"10.0.0.0/40"} },
		"--agent":                  func(c *Config) { c.Agents.Custom = []string{"no command"} },
	} {
		c := Default()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v", flag, err)
		}
	}
}
