package agents

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A known agent is offered only when its executable is installed; custom
// agents are the operator's names; anything else is refused with the list.
func TestCatalogNamesInstalledKnownAndCustomAgents(t *testing.T) {
	opencode, ok := Lookup("opencode")
	if !ok {
		t.Fatal("opencode is not a known agent")
	}
	modules := t.TempDir()
	c := Catalog{Modules: modules, Custom: map[string][]string{"mine": {"/opt/mine", "--acp"}}}
	if got := c.Names(); !slices.Equal(got, []string{"cohort", "mine"}) {
		t.Fatalf("nothing installed: names %v", got)
	}
	if err := c.Check("opencode"); err == nil || !strings.Contains(err.Error(), "cohort, mine") {
		t.Fatalf("opencode not installed: %v", err)
	}
	bin := filepath.Join(modules, ".bin", opencode.Bin)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !slices.Equal(got, []string{"cohort", "mine", "opencode"}) {
		t.Fatalf("opencode installed: names %v", got)
	}
	for _, ok := range []string{"", "cohort", "opencode", "mine"} {
		if err := c.Check(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"codex", "claude", "sh -c id", "OpenCode", "../opencode"} {
		if err := c.Check(bad); err == nil {
			t.Errorf("%q allowed", bad)
		}
	}
	r, err := c.Resolve("opencode")
	if err != nil || r.Profile == nil || r.Command[0] != bin || r.Endpoint != opencode.Provider {
		t.Fatalf("resolve opencode: %+v %v", r, err)
	}
	c.Endpoints = map[string]string{"opencode": "http://localhost:9"}
	if r, _ := c.Resolve("opencode"); r.Endpoint != "http://localhost:9" {
		t.Fatalf("endpoint override: %+v", r)
	}
	if r, _ := c.Resolve("mine"); r.Profile != nil || !slices.Equal(r.Command, []string{"/opt/mine", "--acp"}) {
		t.Fatalf("resolve custom: %+v", r)
	}
	if r, _ := c.Resolve(""); r.Name != Builtin || r.Command != nil {
		t.Fatalf("resolve built-in: %+v", r)
	}
}

func TestParseCustomAndEndpointsNameTheBadEntry(t *testing.T) {
	if _, err := ParseCustom([]string{"ok=/bin/agent --acp", "Bad=/x"}); err == nil || !strings.Contains(err.Error(), `"Bad"`) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := ParseCustom([]string{"cohort=/x"}); err == nil {
		t.Fatal("a custom agent may not shadow the built-in one")
	}
	if _, err := ParseCustom([]string{"empty="}); err == nil {
		t.Fatal("empty command accepted")
	}
	got, err := ParseCustom([]string{" mine = /opt/mine  --acp "})
	if err != nil || !slices.Equal(got["mine"], []string{"/opt/mine", "--acp"}) {
		t.Fatalf("parse: %v %v", got, err)
	}
	if _, err := ParseEndpoints([]string{"nosuch=http://x"}); err == nil {
		t.Fatal("endpoint of an unknown agent accepted")
	}
	if _, err := ParseEndpoints([]string{"opencode=ftp://x"}); err == nil {
		t.Fatal("ftp endpoint accepted")
	}
	if e, err := ParseEndpoints([]string{"opencode=https://proxy.example.com/"}); err != nil || e["opencode"] != "https://proxy.example.com" {
		t.Fatalf("endpoint: %v %v", e, err)
	}
}

// Install writes the profile's files under the home it is given and
// nowhere else, and falls back to the profile's model for Cohort's own.
func TestInstallWritesOnlyUnderHome(t *testing.T) {
	var seen Setup
	p := Profile{Name: "t", Model: "m-default", Setup: func(s Setup) ([]string, map[string]string) {
		seen = s
		return []string{"A=1"}, map[string]string{"conf/x.json": "{}"}
	}}
	home := filepath.Join(t.TempDir(), "home")
	env, err := p.Install(Setup{BaseURL: "http://b", Key: "k", Model: "cohort/demo", Home: home})
	if err != nil || !slices.Equal(env, []string{"HOME=" + home, "A=1"}) || seen.Model != "m-default" {
		t.Fatalf("install: %v %v %+v", env, err, seen)
	}
	if b, err := os.ReadFile(filepath.Join(home, "conf", "x.json")); err != nil || string(b) != "{}" {
		t.Fatalf("file: %q %v", b, err)
	}
	p.Setup = func(Setup) ([]string, map[string]string) { return nil, map[string]string{"../escape": "x"} }
	if _, err := p.Install(Setup{Home: home}); err == nil {
		t.Fatal("a file outside home was written")
	}
}

func TestParseAuthMethods(t *testing.T) {
	m, err := ParseAuthMethods([]string{"codex=chatgpt", "mine=api-key"})
	if err != nil || m["codex"] != "chatgpt" || m["mine"] != "api-key" {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"codex", "=x", "codex=", "codex=a b"} {
		if _, err := ParseAuthMethods([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
