package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/internd"
)

// TestMain lets the test binary stand in for the cohort executable: `cohort
// serve`'s local provisioner starts `<this binary> intern …` (and a daemon
// starts `<this binary> agent`), and the tests' `serve` and `admin …`
// children must run the command, not the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && slices.Contains([]string{"intern", "agent", "serve", "admin"}, os.Args[1]) {
		if os.Getenv(forbidNamespacesEnv) == "1" {
			forbidNamespaces()
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			os.Stderr.WriteString("cohort: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// forbidNamespacesEnv asks the test binary, run as a command in a user
// namespace of its own, to set that namespace's limits on new namespaces
// to zero first: a machine where no jail can be made, as in a container
// without the privilege or a kernel that forbids unprivileged ones.
const forbidNamespacesEnv = "COHORT_TEST_FORBID_NAMESPACES"

func forbidNamespaces() {
	for _, kind := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"} {
		if err := os.WriteFile("/proc/sys/user/max_"+kind+"_namespaces", []byte("0"), 0); err != nil {
			os.Stderr.WriteString("forbid namespaces: " + err.Error() + "\n")
			os.Exit(3)
		}
	}
}

// The bootstrap demo intern ends up running under `cohort serve` with the
// local provisioner: its daemon is a real `cohort intern` process.
func TestServeRunsDemoIntern(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base, _, stop := startServe(t, "--data-dir", dir)
	defer stop()
	b, err := os.ReadFile(filepath.Join(dir, "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]string
	json.Unmarshal(b, &boot)
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := cli(t, "admin", "intern", "get", "--data-dir", dir, "--org", boot["organization_id"], "--id", boot["intern_id"], "--json")
		if err != nil {
			t.Fatal(err)
		}
		var in map[string]any
		json.Unmarshal([]byte(out), &in)
		if in["state"] == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo intern never reached running: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, "interns", boot["intern_id"], "sessions")); err != nil {
		t.Fatalf("the daemon's data directory: %v", err)
	}

	// End to end: gateway → daemon → built-in agent (cohort/demo) → SSE.
	chat := func(body string) []map[string]any {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/api/v1/interns/"+boot["intern_id"]+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+boot["workspace_key"])
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("chat: %d %s", res.StatusCode, raw)
		}
		var chunks []map[string]any
		lines := strings.Split(string(raw), "\n")
		if !strings.Contains(string(raw), "data: [DONE]") {
			t.Fatalf("stream without [DONE]: %s", raw)
		}
		for _, l := range lines {
			if d, ok := strings.CutPrefix(l, "data: "); ok && d != "[DONE]" {
				var c map[string]any
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatalf("chunk %q: %v", d, err)
				}
				chunks = append(chunks, c)
			}
		}
		return chunks
	}
	content := func(chunks []map[string]any) (text, finish string, toolCall map[string]any, session any) {
		for _, c := range chunks {
			if s, ok := c["session_id"]; ok {
				session = s
			}
			for _, ch := range c["choices"].([]any) {
				ch := ch.(map[string]any)
				d := ch["delta"].(map[string]any)
				if s, ok := d["content"].(string); ok {
					text += s
				}
				if tc, ok := d["tool_calls"].([]any); ok {
					toolCall = tc[0].(map[string]any)
				}
				if f, ok := ch["finish_reason"].(string); ok {
					finish = f
				}
			}
		}
		return
	}
	text, finish, _, _ := content(chat(`{"stream":true,"messages":[{"role":"user","content":"hello"}]}`))
	if finish != "stop" || !strings.Contains(text, "You said: hello") {
		t.Fatalf("hello: %q %q", text, finish)
	}
	// Manual mode: the shell asks first; the answer resumes the run.
	_, finish, tc, session := content(chat(`{"stream":true,"approval_mode":"manual","messages":[{"role":"user","content":"$ echo e2e"}]}`))
	if finish != "tool_calls" || tc == nil || session == nil {
		t.Fatalf("manual shell: %q %v %v", finish, tc, session)
	}
	echo, _ := json.Marshal(tc)
	text, finish, _, _ = content(chat(`{"stream":true,"session_id":` + mustJSON(session) + `,"messages":[` +
		`{"role":"assistant","content":null,"tool_calls":[` + string(echo) + `]},` +
		`{"role":"tool","tool_call_id":` + mustJSON(tc["id"]) + `,"content":"allow_once"}]}`))
	if finish != "stop" || !strings.Contains(text, `e2e`) {
		t.Fatalf("after allow_once: %q %q", text, finish)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// `cohort admin intern register` records a remote daemon: checked against
// the daemon first, stored wrapped, never printed.
func TestAdminInternRegister(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	db := []string{"--data-dir", dataDir}
	run1 := func(args ...string) map[string]any {
		t.Helper()
		out, err := cli(t, append(append(args, "--json"), db...)...)
		var m map[string]any
		if err != nil || json.Unmarshal([]byte(out), &m) != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return m
	}
	org := run1("admin", "--init", "org", "create", "--name", "Remote", "--interns-programme")["id"].(string)
	uid := run1("admin", "user", "create", "--org", org, "--email", "ops@remote.test")["id"].(string)
	ws := run1("admin", "workspace", "create", "--org", org, "--user", uid, "--name", "W")["id"].(string)
	id := run1("admin", "intern", "create", "--org", org, "--workspace", ws, "--name", "far")["id"].(string)

	const secret = "operator-chosen-daemon-secret"
	d, err := internd.New(internd.Config{InternID: id, Secret: secret, DataDir: t.TempDir(), AgentCommand: []string{"/nonexistent"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(d.Handler())
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(func() { srv.Close(); d.Close() })

	secretFile := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secretFile, []byte("wrong\n"), 0o600)
	// No gateway ever started here, so there is no KEK yet: admin does not
	// make one up unless told to (--init).
	kekFile := filepath.Join(dataDir, "kek.json")
	if _, err := cli(t, append([]string{"admin", "intern", "register", "--id", id, "--url", srv.URL, "--secret-file", secretFile}, db...)...); err == nil || !strings.Contains(err.Error(), "no key-encryption key at "+kekFile) || !strings.Contains(err.Error(), "--init") {
		t.Fatalf("register without a KEK: %v", err)
	}
	if _, err := os.Stat(kekFile); !os.IsNotExist(err) {
		t.Fatalf("admin created %s without --init: %v", kekFile, err)
	}
	if _, err := cli(t, append([]string{"admin", "intern", "register", "--init", "--id", id, "--url", srv.URL, "--secret-file", secretFile}, db...)...); err == nil || !strings.Contains(err.Error(), "intern_unreachable") {
		t.Fatalf("a wrong secret must be refused: %v", err)
	}
	os.WriteFile(secretFile, []byte(secret+"\n"), 0o600)
	out, err := cli(t, append([]string{"admin", "intern", "register", "--id", id, "--url", srv.URL, "--secret-file", secretFile, "--json"}, db...)...)
	if err != nil {
		t.Fatal(err)
	}
	var in map[string]any
	json.Unmarshal([]byte(out), &in)
	if in["state"] != "running" || strings.Contains(out, secret) {
		t.Fatalf("register: %s", out)
	}
	for _, f := range []string{"cohort.db", "cohort.db-wal"} {
		raw, _ := os.ReadFile(filepath.Join(dataDir, f))
		if strings.Contains(string(raw), secret) {
			t.Fatalf("the daemon secret is in %s in clear", f)
		}
	}
}
