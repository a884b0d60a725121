package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// onMachineWithoutUserNamespaces runs `cohort serve` as an unprivileged
// user on a machine that allows no user namespaces: the gateway runs in a
// user namespace of its own whose limit (user.max_user_namespaces, which
// each user namespace has) is 0, as an unprivileged uid. The user has a
// subordinate id range, so that what the refusal names is the missing
// namespaces (a user without one is refused first for that).
func onMachineWithoutUserNamespaces(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to build the namespace-less machine")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755) // t.TempDir makes its parent 0700
	os.Chmod(dir, 0o777)
	bin := filepath.Join(dir, "cohort")
	data, err := os.ReadFile(cohortBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	u := testutil.NewUser(t, "cfc", true)
	script := fmt.Sprintf(`echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --reuid %d --regid %d --clear-groups -- "$@"`, u.UID, u.GID)
	cmd := exec.Command("sh", append([]string{"-c", script, "sh", bin, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}},
		GidMappingsEnableSetgroups: true}
	return cmd
}

// Where the machine cannot make jails, the local provisioner refuses to
// start: the error names the missing kernel feature and the remedies.
func TestLocalProvisionerFailsClosed(t *testing.T) {
	cmd := onMachineWithoutUserNamespaces(t)
	cmd.WaitDelay = wait
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("serve started without jails:\n%s", out)
	}
	s := string(out)
	for _, want := range []string{"cannot jail interns", "user namespaces", "user.max_user_namespaces", "--unsafe-shared-host"} {
		if !strings.Contains(s, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "listening on") {
		t.Errorf("it listened before refusing:\n%s", s)
	}
	// And it wrote nothing: no database, KEK or bootstrap keys.
	for i, a := range cmd.Args {
		if a == "--data-dir" {
			entries, err := os.ReadDir(cmd.Args[i+1])
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("it refused to start but left %s in its data directory", e.Name())
			}
		}
	}
}

// --unsafe-shared-host runs interns unjailed there, says so loudly at start
// and in /readyz, and the demo intern answers.
func TestUnsafeSharedHostWarns(t *testing.T) {
	cmd := onMachineWithoutUserNamespaces(t, "--unsafe-shared-host")
	// What the operator's shell holds besides Cohort's settings: neither
	// the unjailed daemon nor its agent may get it.
	cmd.Env = append(cmd.Env, "AWS_SECRET_ACCESS_KEY=e2e-aws", "E2E_CANARY=e2e-canary")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testutil.SyncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: "unsafe gateway", cmd: cmd, stderr: stderr, done: make(chan struct{})}
	go p.wait()
	t.Cleanup(func() { p.Stop(t) })
	lines := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		var acc string
		for {
			n, err := out.Read(b)
			acc += string(b[:n])
			if m := addrRE.FindStringSubmatch(acc); m != nil {
				lines <- m[1]
				io.Copy(io.Discard, out)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case p.URL = <-lines:
	case <-p.done:
		t.Fatalf("exited: %s\n%s", p.exit, stderr)
	case <-time.After(wait):
		t.Fatalf("did not listen:\n%s", stderr)
	}
	// stderr reaches us through a pipe copied apart from stdout.
	testutil.Eventually(t, wait, "the warning at start", func() bool { return strings.Contains(stderr.String(), "WARNING: --unsafe-shared-host") })
	res, err := http.Get(p.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]string
	json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	if res.StatusCode != 200 || body["status"] != "ready" || !strings.Contains(body["warning"], "unjailed") {
		t.Fatalf("/readyz: %d %v", res.StatusCode, body)
	}

	// The demo intern's command (run unsandboxed here, a child of the
	// agent) cannot open its agent's ($PPID) /proc entries: it is in a
	// Landlock domain of its own. The test reads the agent's environment
	// itself: PATH, and none of the canaries.
	var data string
	for i, a := range cmd.Args {
		if a == "--data-dir" {
			data = cmd.Args[i+1]
		}
	}
	b, err := os.ReadFile(filepath.Join(data, "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]string
	json.Unmarshal(b, &boot)
	s := readAll(t, chat(t, p, boot["workspace_key"], boot["intern_id"], user(
		`$ head -c1 /proc/$PPID/environ >/dev/null 2>&1 && echo reached-$((40+2)); echo probed`)))
	if !strings.Contains(s.Text, "probed") || strings.Contains(s.Text, "reached-42") {
		t.Fatalf("a command read its agent's environment: %q", s.Text)
	}
	agent := regexp.MustCompile(`"msg":"agent started".*?"pid":(\d+)`).FindStringSubmatch(stderr.String())
	if agent == nil {
		t.Fatalf("no agent pid in the log:\n%s", stderr)
	}
	agentEnv, err := os.ReadFile("/proc/" + agent[1] + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, kv := range strings.Split(string(agentEnv), "\x00") {
		if n, _, _ := strings.Cut(kv, "="); n == "PATH" || strings.HasPrefix(n, "AWS_") || strings.HasPrefix(n, "E2E_") {
			names = append(names, n)
		}
	}
	if strings.Join(names, ",") != "PATH" {
		t.Fatalf("the agent's environment holds %v, want PATH alone of these", names)
	}
	// The daemon is not dumpable: the test reads its environment itself.
	m := regexp.MustCompile(`"msg":"intern daemon running".*?"pid":(\d+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no daemon pid in the log:\n%s", stderr)
	}
	env, err := os.ReadFile("/proc/" + m[1] + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "\x00PATH=") && !strings.HasPrefix(string(env), "PATH=") || strings.Contains(string(env), "e2e-") {
		t.Fatalf("the unjailed daemon's environment: %q", env)
	}
}
