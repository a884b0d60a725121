package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenRE = regexp.MustCompile(`listening on (http://\S+)`)

// startServe runs `cohort serve` in-process and returns its base URL, its
// stdout and a stop function that waits for graceful shutdown.
func startServe(t *testing.T, args ...string) (string, *syncBuf, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &syncBuf{}, &syncBuf{}
	done := make(chan error, 1)
	// The jails end with the test's gateway (--jail-orphan-timeout 0).
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--jail-orphan-timeout", "0"}, args...)
	go func() { done <- run(ctx, args, out, errOut) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listenRE.FindStringSubmatch(out.String()); m != nil {
			return m[1], out, func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("serve: %v", err)
				}
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	t.Fatalf("serve did not start:\n%s\n%s", out.String(), errOut.String())
	return "", nil, nil
}

func TestServeBootstrapsOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url, out, stop := startServe(t, "--data-dir", dir)
	b, err := os.ReadFile(filepath.Join(dir, "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(filepath.Join(dir, "bootstrap.json"))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("bootstrap.json mode %v", st.Mode().Perm())
	}
	var boot map[string]string
	if err := json.Unmarshal(b, &boot); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"organization_id", "management_key", "workspace_id", "workspace_key", "intern_id"} {
		if boot[k] == "" {
			t.Fatalf("bootstrap.json lacks %s: %s", k, b)
		}
		if !strings.Contains(out.String(), boot[k]) {
			t.Fatalf("first start did not print %s", k)
		}
	}
	// The printed management key works against the running server.
	req, _ := http.NewRequest("POST", url+"/api/v1/workspaces", strings.NewReader(`{"name":"From the README"}`))
	req.Header.Set("Authorization", "Bearer "+boot["management_key"])
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 201 {
		t.Fatalf("create with bootstrap key: %d", res.StatusCode)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		res, err := http.Get(url + p)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, res, err)
		}
		res.Body.Close()
	}
	stop()
	// A second start finds the organization and prints no keys.
	_, out2, stop2 := startServe(t, "--data-dir", dir)
	stop2()
	if strings.Contains(out2.String(), "cohort_mk_") || strings.Contains(out2.String(), "Bootstrapped") {
		t.Fatalf("second start bootstrapped again:\n%s", out2.String())
	}
}

func TestServeNoBootstrapOnPostgres(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, out, stop := startServe(t, "--data-dir", dir, "--database-url", storetest.PostgresURL(t), "--no-bootstrap")
	stop()
	if strings.Contains(out.String(), "Bootstrapped") {
		t.Fatal("--no-bootstrap bootstrapped")
	}
	if _, err := os.Stat(filepath.Join(dir, "bootstrap.json")); !os.IsNotExist(err) {
		t.Fatal("--no-bootstrap wrote bootstrap.json")
	}
}

func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	return out.String(), err
}

// TestAdminCLI walks the operator's CLI through an organization, a user, a
// workspace, keys and an intern, reading its --json output.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	db := []string{"--data-dir", t.TempDir()}
	var org map[string]any
	out, err := cli(t, append([]string{"admin", "--init", "org", "create", "--name", "Acme", "--interns-programme", "--json"}, db...)...)
	if err != nil || json.Unmarshal([]byte(out), &org) != nil {
		t.Fatalf("org create: %v %s", err, out)
	}
	orgID := org["id"].(string)
	if ent := org["entitlements"].(map[string]any); ent["interns_programme"] != true || ent["vault_writes"] != nil {
		t.Fatalf("entitlements %v", ent)
	}
	one := func(args ...string) map[string]any {
		t.Helper()
		out, err := cli(t, append(append(args, "--org", orgID, "--json"), db...)...)
		var m map[string]any
		if err != nil || json.Unmarshal([]byte(out), &m) != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return m
	}
	user := one("admin", "user", "create", "--email", "ops@acme.test", "--role", "admin")
	uid := user["id"].(string)
	ws := one("admin", "workspace", "create", "--user", uid, "--name", "Ops Team")
	if ws["slug"] != "ops-team" {
		t.Fatalf("workspace %v", ws)
	}
	key := one("admin", "key", "create", "--user", uid, "--kind", "workspace", "--workspace", ws["id"].(string))
	if !strings.HasPrefix(key["key"].(string), "cohort_wk_") {
		t.Fatalf("key %v", key)
	}
	keyID := key["api_key"].(map[string]any)["id"].(string)
	if d := one("admin", "key", "disable", "--id", keyID); d["disabled"] != true {
		t.Fatalf("disable %v", d)
	}
	in := one("admin", "intern", "create", "--workspace", ws["id"].(string), "--name", "bot")
	if in["model"] != "cohort/demo" || in["state"] != "provisioning" {
		t.Fatalf("intern %v", in)
	}
	if s := one("admin", "intern", "suspend", "--id", in["id"].(string)); s["state"] != "suspended" {
		t.Fatalf("suspend %v", s)
	}
	out, err = cli(t, append([]string{"admin", "key", "list", "--org", orgID, "--json"}, db...)...)
	var keys []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &keys) != nil || len(keys) != 1 {
		t.Fatalf("key list: %v %s", err, out)
	}
	if strings.Contains(out, key["key"].(string)) {
		t.Fatal("key list shows the key")
	}
	// Errors are reported, not swallowed.
	if _, err := cli(t, append([]string{"admin", "key", "create", "--org", orgID, "--user", uid, "--kind", "root"}, db...)...); err == nil {
		t.Fatal("bad kind accepted")
	}
	if _, err := cli(t, "admin", "nope", "nope"); err == nil {
		t.Fatal("unknown command accepted")
	}
	if _, err := cli(t, append([]string{"migrate"}, db...)...); err != nil {
		t.Fatal(err)
	}
}

// A malformed --turn-rate stops serve with a message naming the flag.
func TestServeRejectsBadTurnRate(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuf
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--turn-rate", "fast"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--turn-rate") {
		t.Fatalf("err = %v", err)
	}
}

// The fleet's flags refuse malformed values, naming the flag; nothing
// starts.
func TestServeRejectsBadFleetFlags(t *testing.T) {
	t.Parallel()
	for _, c := range [][]string{
		{"--intern-idle-timeout", "ten"}, {"--intern-idle-timeout", "-1s"},
		{"--jail-orphan-timeout", "soon"}, {"--jail-orphan-timeout", "-1m"},
		{"--max-awake-interns", "many"}, {"--max-awake-interns", "-2"},
		{"--intern-start-concurrency", "0"}, {"--intern-start-concurrency", "1.5"},
	} {
		dir := t.TempDir()
		var out, errOut syncBuf
		err := run(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir}, c...), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c[0]) || !strings.Contains(err.Error(), c[1]) {
			t.Errorf("%v: err = %v", c, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "cohort.db")); err == nil {
			t.Errorf("%v: a database was created", c)
		}
	}
}

// The chat and interaction timing settings refuse malformed or
// non-positive values, naming the flag.
func TestServeRejectsBadTimings(t *testing.T) {
	t.Parallel()
	for _, c := range [][]string{
		{"--chat-keepalive", "soon"}, {"--chat-keepalive", "0s"}, {"--first-event-timeout", "-1s"},
		{"--event-timeout", "x"}, {"--turn-timeout", "0s"}, {"--interaction-deadline", "0"}, {"--shutdown-timeout", "never"},
	} {
		var out, errOut syncBuf
		err := run(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, c...), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c[0]) {
			t.Errorf("%v: err = %v", c, err)
		}
	}
}

// A malformed --federation-allow-hosts entry stops serve, naming the flag.
func TestServeRejectsBadAllowHosts(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuf
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--federation-allow-hosts", "10.0.0.0/8,10.0.0.0/40"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "federation-allow-hosts") || !strings.Contains(err.Error(), "10.0.0.0/40") {
		t.Fatalf("err = %v", err)
	}
}

// serve -h shows every flag once, under a heading (none left to "Other"),
// and each names the variable that sets it too.
func TestServeHelpGroupsEveryFlag(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuf
	if err := run(context.Background(), []string{"serve", "-h"}, &out, &errOut); err != nil && !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	help := errOut.String()
	if strings.Contains(help, "\nOther:") || !strings.Contains(help, "\nInterns:\n") {
		t.Fatalf("help is not grouped:\n%s", help)
	}
	flags := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(help, -1)
	if len(flags) < 25 {
		t.Fatalf("%d flags in the help:\n%s", len(flags), help)
	}
	seen := map[string]bool{}
	for _, f := range flags {
		if seen[f[1]] {
			t.Errorf("-%s shown twice", f[1])
		}
		seen[f[1]] = true
	}
	for _, entry := range strings.Split(help, "\n  -")[1:] {
		if !strings.Contains(entry, "COHORT_") {
			t.Errorf("no variable named for -%s", strings.SplitN(entry, "\n", 2)[0])
		}
	}
}

// The interns' egress allowlist and the http_request CA are checked at
// start, naming the flag; nothing starts.
func TestServeRejectsBadInternEgressSettings(t *testing.T) {
	t.Parallel()
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"--intern-egress-allow-hosts", "10.0.0.0/40"},
		{"--http-tool-ca-file", notPEM},
		{"--http-tool-ca-file", filepath.Join(t.TempDir(), "missing.pem")},
	} {
		dir := t.TempDir()
		var out, errOut syncBuf
		err := run(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir}, c...), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c[0]) {
			t.Errorf("%v: err = %v", c, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "cohort.db")); err == nil {
			t.Errorf("%v: a database was created", c)
		}
	}
}

// The Kubernetes size settings refuse what is not a positive quantity,
// naming the flag, before anything is written.
func TestServeRejectsBadKubeSizes(t *testing.T) {
	t.Parallel()
	for _, c := range [][]string{
		{"--kube-tmp-size", "0"}, {"--kube-tmp-size", "lots"}, {"--kube-tmp-size", "-1Gi"}, {"--kube-storage-size", "0"},
	} {
		dir := t.TempDir()
		var out, errOut syncBuf
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--provisioner", "kubernetes",
			"--kube-image", "ghcr.io/cohort-dev/cohort:test", "--kube-gateway-url", "http://gw:8080"}, c...)
		err := run(context.Background(), args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c[0]) || !strings.Contains(err.Error(), c[1]) {
			t.Errorf("%v: err = %v", c, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%v: %d files written", c, len(entries))
		}
	}
}
