package localjail

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
)

func TestJailConfigCheckRefusesBindsUnderHiddenPaths(t *testing.T) {
	c := JailConfig{Hide: []string{"/srv/cohort", "/opt/cohort/bin"}}
	for _, ok := range []string{"/srv/cohort-agents", "/srv", "/opt/cohort", "/usr/lib/node_modules"} {
		c.ReadOnly = []string{ok}
		if err := c.Check(); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"/srv/cohort", "/srv/cohort/agents", "/opt/cohort/bin/node"} {
		c.ReadOnly = []string{"/usr/local/lib", bad}
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// Each intern's jail user is its own, stable across restarts, and in the
// dedicated range.
func TestJailUID(t *testing.T) {
	a, b := jailUID("2d0f1c1e-0000-4000-8000-000000000001"), jailUID("2d0f1c1e-0000-4000-8000-000000000002")
	if a == b || a != jailUID("2d0f1c1e-0000-4000-8000-000000000001") {
		t.Fatalf("uids %d %d", a, b)
	}
	for _, u := range []int{a, b} {
		if u < 2_000_000_000 || u >= 2_100_000_000 {
			t.Fatalf("uid %d outside the range", u)
		}
	}
}

type specRelay struct{ Relay }

func (specRelay) InJailModelURL(addr string) string { return "http://" + addr + "/v1" }

// With the proxy CA, the jail gets one bundle, the system roots and the
// CA, and every variable programs read a bundle from names it; without,
// neither (ADR 0932).
func TestSpecCABundle(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nMIIBproxyca\n-----END CERTIFICATE-----\n"
	dj := DaemonJail{Daemon: launch.Daemon{InternID: "2d0f1c1e-0000-4000-8000-000000000001", Model: "m"}, HostDir: t.TempDir(), Self: []string{"/bin/true"},
		JailConfig: JailConfig{Relay: specRelay{}, ProxyCA: ca}}
	spec := dj.Spec()
	var bundle string
	for _, f := range spec.Files {
		if f.Dst == CABundlePath {
			bundle = f.Content
		}
	}
	if !strings.HasSuffix(bundle, ca) || strings.Contains(bundle, "PRIVATE KEY") {
		t.Fatalf("bundle %.200q", bundle)
	}
	if fi, err := os.Lstat("/etc/ssl/certs/ca-certificates.crt"); err == nil && fi.Mode().IsRegular() {
		if strings.Count(bundle, "BEGIN CERTIFICATE") < 10 {
			t.Fatal("the bundle lacks the system roots")
		}
		// The jail's copy of the system bundle is the same bundle.
		if !slices.Contains(spec.Files, jail.File{Dst: "/etc/ssl/certs/ca-certificates.crt", Content: bundle}) {
			t.Fatal("the jail's system bundle lacks the CA")
		}
	}
	for _, v := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "NPM_CONFIG_CAFILE"} {
		if !slices.Contains(spec.Env, v+"="+CABundlePath) {
			t.Errorf("%s not set: %q", v, spec.Env)
		}
	}
	dj.ProxyCA = ""
	for _, e := range dj.Spec().Env {
		if strings.HasPrefix(e, "SSL_CERT_FILE=") {
			t.Fatalf("without the CA: %s", e)
		}
	}
}

// A jail's argv is part of its tag: the same settings must encode to the
// same argv, or an upgraded gateway replaces every jail it could adopt
// (ADR 0951). The argv here is the one gateways wrote before launch.Daemon.
func TestJailArgvStable(t *testing.T) {
	mods := t.TempDir()
	if err := os.MkdirAll(filepath.Join(mods, ".bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mods, ".bin", "codex-acp"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &Backend{DataDir: t.TempDir(), InteractionDeadline: 3 * time.Minute, HTTPToolCAFile: "/ca.pem",
		Agents: provision.Agents{Catalog: agents.Catalog{Modules: mods, AuthMethods: map[string]string{"codex": "openai"}}},
		Jail:   &JailConfig{Relay: specRelay{}, HTTPToolCA: "PEM"}}
	dj, err := b.daemonJail("i-1", "m-1", "codex", config.InternLimits{}, t.TempDir(), []string{"/usr/bin/cohort", "sub"})
	if err != nil {
		t.Fatal(err)
	}
	want := "/run/cohort/bin/cohort sub intern --listen-fd 3 --secret-fd 4 --data-dir /intern --intern-id i-1 --model m-1" +
		" --gateway-url http://127.0.0.1:7102/api/v1 --http-tool-proxy http://127.0.0.1:7103 --interaction-deadline 3m0s" +
		" --agent codex --agent-modules " + mods + " --agent-key-placeholder " + agents.KeyPlaceholder + " --agent-auth-method openai" +
		" --http-tool-ca-file /run/cohort/http-tool-ca.pem"
	if got := strings.Join(dj.Spec().Argv, " "); got != want {
		t.Fatalf("argv\n%s\nwant\n%s", got, want)
	}
}
