package gvisor_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/gvisor"
	"github.com/cohort-dev/cohort/internal/testing/gvisortest"
)

// --provisioner gvisor fails closed at Check, before anything is written,
// when runsc is missing or cannot start a sandbox, naming the package.
func TestCheckFailsClosed(t *testing.T) {
	k, err := provision.Lookup("gvisor")
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho cannot create sandbox >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, runsc := range map[string]string{"missing": filepath.Join(t.TempDir(), "no-runsc"), "broken": broken} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		s := k.Flags(fs)
		if err := fs.Parse([]string{"--gvisor-runsc", runsc}); err != nil {
			t.Fatal(err)
		}
		err := s.Check(config.Config{})
		if err == nil || !strings.Contains(err.Error(), "runsc") || !strings.Contains(err.Error(), "package "+gvisor.Package) && !strings.Contains(err.Error(), "apt-get install "+gvisor.Package) {
			t.Errorf("%s runsc: Check says %v, want a refusal naming the package", name, err)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s := k.Flags(fs)
	if err := fs.Parse([]string{"--unsafe-shared-host"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(config.Config{}); err == nil {
		t.Error("--unsafe-shared-host with --provisioner gvisor is not refused")
	}
}

// With no --gvisor-platform the sandbox runs on runsc's own default, which
// the check reads and reports: systrap for the pinned release, ptrace for
// Debian's 2022 package; a platform named is used as named.
func TestCheckRunscPlatform(t *testing.T) {
	t.Parallel()
	for runsc, want := range map[string]string{gvisortest.Runsc(t): "systrap", gvisortest.Debian(t): "ptrace"} {
		if got, err := gvisor.CheckRunsc(runsc, ""); err != nil || got != want {
			t.Errorf("%s: platform %q, %v; want %q", runsc, got, err, want)
		}
	}
	if got, err := gvisor.CheckRunsc(gvisortest.Runsc(t), "ptrace"); err != nil || got != "ptrace" {
		t.Errorf("pinned runsc on ptrace: %q, %v", got, err)
	}
	if _, err := gvisor.CheckRunsc(gvisortest.Debian(t), "systrap"); err == nil || !strings.Contains(err.Error(), "systrap platform") {
		t.Errorf("Debian's runsc on systrap: %v, want a refusal naming the platform", err)
	}
}
