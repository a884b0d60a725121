package main

import (
	"context"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/config"
)

// Every admin command declares its own flags: each one its synopsis names,
// and `cohort admin NOUN VERB -h` shows those, not another command's.
func TestAdminCommandsDeclareTheirFlags(t *testing.T) {
	t.Parallel()
	named := regexp.MustCompile(`--([a-z][a-z-]*)`)
	for name, cmd := range adminCmds() {
		fs, _ := cmd.flagSet(name, io.Discard)
		for _, m := range named.FindAllStringSubmatch(cmd.help, -1) {
			if m[1] != "provisioner" && fs.Lookup(m[1]) == nil {
				t.Errorf("%s: its synopsis names --%s, which it does not declare", name, m[1])
			}
		}
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"admin", "org", "create", "-h"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	if !strings.Contains(help, "-interns-programme") || !strings.Contains(help, "-data-dir") || strings.Contains(help, "-issuer-url") || strings.Contains(help, "-page-size") {
		t.Fatalf("admin org create -h shows other commands' flags, or not its own:\n%s", help)
	}
	err := run(context.Background(), []string{"admin", "org", "list", "--issuer-url", "https://x"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "issuer-url") {
		t.Fatalf("org list took another command's flag: %v", err)
	}
}

// The operator's policies admin applies are read as serve reads them:
// given the same way (a variable, or a flag), they are the same in both
// (ADR 0962). Before, admin read some from variables alone, so a flag
// given to both applied to serve only.
func TestAdminReadsServePolicies(t *testing.T) {
	policies := []struct {
		flag, value, command string
		get                  func(config.Config) any
	}{
		{"federation-allow-hosts", "10.1.0.0/16,idp.internal", "federation dry-run", func(c config.Config) any { return c.Federation.AllowHosts }},
		{"extra-ca-file", "/etc/company-ca.pem", "federation issuer-create", func(c config.Config) any { return c.Federation.ExtraCAFile }},
		{"webhook-allow-hosts", "10.2.0.0/16", "webhook create", func(c config.Config) any { return c.Webhooks.AllowHosts }},
		{"intern-memory", "1GiB", "intern create", func(c config.Config) any { return c.Fleet.Limits }},
		{"intern-cpus", "0.5", "intern update", func(c config.Config) any { return c.Fleet.Limits }},
		{"agent-modules", "/opt/agents/node_modules", "intern create", func(c config.Config) any { return c.Agents.Modules }},
		{"agent-endpoint", "codex=https://llm.internal/v1", "intern update", func(c config.Config) any { return c.Agents.Endpoints }},
	}
	serveConfig := func(t *testing.T, args ...string) config.Config {
		cfg := config.Default()
		if err := newServeFlags(&cfg, io.Discard).parse(args); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	adminConfig := func(t *testing.T, command string, args ...string) config.Config {
		fs, e := adminCmds()[command].flagSet(command, io.Discard)
		if _, err := parseInterspersed(fs, args); err != nil {
			t.Fatal(err)
		}
		for _, check := range e.checks {
			if err := check(); err != nil {
				t.Fatal(err)
			}
		}
		return e.cfg
	}
	for _, p := range policies {
		t.Run(p.flag, func(t *testing.T) {
			withoutCohortEnv(t)
			def := p.get(serveConfig(t))
			args := []string{"--" + p.flag, p.value}
			if s, a := p.get(serveConfig(t, args...)), p.get(adminConfig(t, p.command, args...)); !reflect.DeepEqual(s, a) || reflect.DeepEqual(s, def) {
				t.Errorf("as a flag: serve %v, admin %s %v", s, p.command, a)
			}
			variable := config.EnvName(p.flag)
			if p.flag == "agent-endpoint" {
				variable = config.ListEnvName(p.flag)
			}
			t.Setenv(variable, p.value)
			if s, a := p.get(serveConfig(t)), p.get(adminConfig(t, p.command)); !reflect.DeepEqual(s, a) || reflect.DeepEqual(s, def) {
				t.Errorf("as %s: serve %v, admin %s %v", variable, s, p.command, a)
			}
		})
	}
}
