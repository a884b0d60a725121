package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/modelserver"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The escape suite in every local mode: a root gateway, a gateway run by
// an unprivileged user, and `cohort intern --jail` run by an unprivileged
// operator. The test makes that user (with a group and a subordinate id
// range) and, in /etc, a file only the user may read and one only its
// group may read: the agent must neither read nor see them, must not be
// the user (nor hold its groups), must find no host path in its
// mountinfo, and reaches neither loopback services, nor the gateway's
// /proc, nor another process's descriptors.

// modeTarget is one mode's intern, as an attacker reaches it.
type modeTarget struct {
	gw       *proc
	wk, id   string
	user     testutil.User // the gateway's (or operator's) user; UID 0 for root
	hostDir  string        // the intern's directory on the host
	hostPath []string      // host paths that must not show inside
}

// etcSecrets writes the two /etc files of user u (root's for UID 0) and
// returns their paths and contents.
func etcSecrets(t *testing.T, u testutil.User, group int) (paths []string, canary string) {
	t.Helper()
	canary = randomCanary("etc")
	suffix := fmt.Sprintf("cohort-escape-%d-%s", u.UID, canary[len(canary)-6:])
	for _, f := range []struct {
		name     string
		uid, gid int
		mode     os.FileMode
	}{{suffix + "-own.secret", u.UID, u.GID, 0o600}, {suffix + "-grp.secret", 0, group, 0o640}} {
		p := "/etc/" + f.name
		if err := os.WriteFile(p, []byte(canary), f.mode); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		if err := os.Chown(p, f.uid, f.gid); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, f.mode)
		paths = append(paths, p)
	}
	return paths, canary
}

// startAs is start run as u, with the binary bin.
func startAs(t *testing.T, u testutil.User, bin, dir, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), append([]string{"HOME=" + dir}, env...)...)
	groups := []uint32{}
	for _, g := range u.Groups {
		groups = append(groups, uint32(g))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: groups}}
	return startCmd(t, name, cmd)
}

// userDir is a new directory owned by u (root's when UID 0), mode 0700,
// in a directory every user may enter.
func userDir(t *testing.T, u testutil.User, name string) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "cohort-modes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	os.Chmod(parent, 0o755)
	// The user's own directory (a home), and in it the one asked for.
	home := filepath.Join(parent, "home")
	dir := filepath.Join(home, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{home, dir} {
		if err := os.Chown(d, u.UID, u.GID); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// openBinary copies cohort where another user may run it.
func openBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cohort-modes-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	b, err := os.ReadFile(cohortBin)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "cohort")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// localGateway starts `serve --provisioner local` as u (root for UID 0)
// and returns its demo intern.
func localGateway(t *testing.T, u testutil.User) modeTarget {
	t.Helper()
	dataDir := userDir(t, u, "data")
	binDir := filepath.Dir(cohortBin)
	args := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--provisioner", "local",
		"--jail-orphan-timeout", "0", "--log-level", "info"}
	var gw *proc
	if u.UID == 0 {
		gw = start(t, "gateway", nil, args...)
	} else {
		bin := openBinary(t)
		binDir = filepath.Dir(bin)
		gw = startAs(t, u, bin, dataDir, "gateway", nil, args...)
	}
	var boot map[string]string
	b, err := os.ReadFile(filepath.Join(dataDir, "bootstrap.json"))
	if err != nil || json.Unmarshal(b, &boot) != nil {
		t.Fatalf("bootstrap.json: %v", err)
	}
	tg := modeTarget{gw: gw, wk: boot["workspace_key"], id: boot["intern_id"], user: u,
		hostDir: filepath.Join(dataDir, "interns", boot["intern_id"]), hostPath: []string{dataDir, binDir}}
	waitTurn(t, gw, tg.wk, tg.id)
	return tg
}

// operatorDaemon starts `cohort intern --jail` as u for a new intern of a
// root gateway with the remote provisioner.
func operatorDaemon(t *testing.T, u testutil.User) modeTarget {
	t.Helper()
	c, gw := newCluster(t, "")
	id := c.NewIntern(t, "operated")
	dataDir := userDir(t, u, "intern")
	secretDir := userDir(t, u, "secret")
	secretFile := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(secretFile, []byte("daemon-secret-"+id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(secretFile, u.UID, u.GID)
	bin := openBinary(t)
	p := startAs(t, u, bin, filepath.Dir(dataDir), "daemon", nil, "intern", "--listen", "127.0.0.1:0", "--data-dir", dataDir,
		"--intern-id", id, "--secret-file", secretFile, "--log-level", "warn", "--jail", "--gateway-url", gw.URL+"/api/v1")
	c.Register(t, &daemon{proc: p, id: id, secretFile: secretFile, dataDir: dataDir})
	tg := modeTarget{gw: gw, wk: c.WK, id: id, user: u, hostDir: dataDir,
		hostPath: []string{dataDir, secretDir, filepath.Dir(bin), c.dataDir}}
	waitTurn(t, gw, tg.wk, tg.id)
	return tg
}

func waitTurn(t *testing.T, gw *proc, wk, id string) {
	t.Helper()
	testutil.Eventually(t, wait, "intern "+id+" answers", func() bool {
		res := chat(t, gw, wk, id, user("ready?x"))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		readAll(t, res)
		return true
	})
}

// shell runs command through the built-in agent's shell tool (self-drive)
// and returns what came back.
func (tg modeTarget) shell(t *testing.T, command string) string {
	t.Helper()
	s := readAll(t, chat(t, tg.gw, tg.wk, tg.id, user("$ "+command+"; echo attempt-$((40+2))")))
	if !strings.Contains(s.Text, "attempt-42") {
		t.Fatalf("the attempt did not run to its end (so it proves nothing): finish %q text %q", s.Finish, s.Text)
	}
	raw, _ := json.Marshal(s.Chunks)
	return s.Text + string(raw)
}

func TestEscapeModes(t *testing.T) {
	// One unprivileged user, in a group of its own, with a subordinate range:
	// the gateway's user, and the operator's.
	u := testutil.NewUser(t, "cgw", true, "csec")
	modes := map[string]func(t *testing.T) modeTarget{
		"root gateway":     func(t *testing.T) modeTarget { return localGateway(t, testutil.User{Groups: u.Groups}) },
		"non-root gateway": func(t *testing.T) modeTarget { return localGateway(t, u) },
		"operator's intern --jail": func(t *testing.T) modeTarget {
			return operatorDaemon(t, u)
		},
	}
	for _, name := range []string{"root gateway", "non-root gateway", "operator's intern --jail"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tg := modes[name](t)
			secrets, canary := etcSecrets(t, tg.user, u.Groups[0])
			suffix := strings.TrimSuffix(filepath.Base(secrets[0]), "-own.secret")
			pg := `bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && echo reached-$((1000000+%d))' 2>&1`
			attempts := []attempt{
				// Readable by the gateway's user (or its group): not by the agent, and not even there.
				{name: "read /etc files of the gateway's user and group",
					command:  "for f in " + strings.Join(secrets, " ") + `; do test -e $f && echo present-$((1+1)); cat $f; done 2>&1; ls -a /etc | grep -c ` + suffix + ` | sed s/^/listed-/; find / \( -path /proc -o -path /sys \) -prune -o -name '*` + suffix + `*' -print 2>/dev/null | sed s/^/found-/`,
					canaries: []string{"etc"}, success: []string{"present-2", "listed-1", "listed-2", "found-/"}},
				{name: "hold the gateway's groups",
					command: `grep ^Groups: /proc/self/status | awk '{print "groups-" NF-1}'; id 2>&1`,
					success: []string{"groups-1", "groups-2", "groups-3", "groups-4"}},
				{name: "read mountinfo for host paths", command: "cat /proc/self/mountinfo /proc/1/mountinfo 2>&1",
					success: tg.hostPath},
				{name: "connect to PostgreSQL", command: fmt.Sprintf(pg, 5432, 5432), success: []string{"reached-1005432"}},
				{name: "connect to Redis", command: fmt.Sprintf(pg, 6379, 6379), success: []string{"reached-1006379"}},
				{name: "read the gateway's /proc", command: fmt.Sprintf(`cat /proc/%d/environ /proc/%d/cmdline 2>&1; ls /proc | grep -c '^[0-9]' | sed s/^/pids-/`, tg.gw.cmd.Process.Pid, tg.gw.cmd.Process.Pid),
					success: []string{"serve", "PATH="}},
				{name: "follow the descriptors /proc shows", command: `python3 -c 'import glob, socket, os
for p in glob.glob("/proc/*/fd/*"):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.settimeout(2); s.connect(p); print("took-" + "over", p)
    except Exception as e:
        pass
    try:
        print(p, os.readlink(p))
    except Exception:
        pass' 2>&1 | head -c 20000`, success: append([]string{"took-over"}, tg.hostPath...)},
				procAttempt(),
				{name: "leave a file as the gateway's user", command: "touch /intern/agent-owned 2>&1"},
			}
			canaries := map[string]string{"etc": canary}
			for _, a := range attempts {
				out := tg.shell(t, a.command)
				a.check(t, name, out, canaries)
				if t.Failed() && testing.Verbose() {
					t.Logf("%s: %s", a.name, tail(out, 3000))
				}
			}
			// The agent's file on the host belongs neither to the gateway's
			// user nor to root.
			st, err := os.Stat(filepath.Join(tg.hostDir, "agent-owned"))
			if err != nil {
				t.Fatalf("the agent's file: %v", err)
			}
			if o := st.Sys().(*syscall.Stat_t); int(o.Uid) == tg.user.UID || o.Uid == 0 || int(o.Gid) == tg.user.GID {
				t.Errorf("the agent's file is owned by %d:%d, the gateway's user is %d:%d", o.Uid, o.Gid, tg.user.UID, tg.user.GID)
			}
		})
	}
}

// A gateway that is not root and whose user has no subordinate range
// refuses to start, and says how to add one.
func TestNonRootGatewayWithoutARangeRefuses(t *testing.T) {
	t.Parallel()
	u := testutil.NewUser(t, "cnr", false)
	dataDir := userDir(t, u, "data")
	bin := openBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// (A gateway that does not refuse runs until the timeout kills it.)
	cmd := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--provisioner", "local")
	cmd.Dir = dataDir
	cmd.Env = append(cleanEnv(), "HOME="+dataDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	out, err := cmd.CombinedOutput()
	if err == nil || !regexp.MustCompile(`usermod --add-subuids`).Match(out) {
		t.Fatalf("serve without a subordinate range: %v\n%s", err, tail(string(out), 3000))
	}
	// It names what is missing, and not a remedy for what was fine (the
	// namespaces) nor a file that is there.
	if !strings.Contains(string(out), "no line for "+u.Name) || strings.Contains(string(out), "unprivileged user namespaces") ||
		strings.Contains(string(out), "file does not exist") {
		t.Fatalf("serve without a subordinate range does not name the cause:\n%s", tail(string(out), 3000))
	}
}

// The known third-party agents run behind a gateway that is not root: a
// text turn each, their modules bound, the agent an id of the gateway
// user's range.
func TestThirdPartyAgentsNonRootGateway(t *testing.T) {
	u := testutil.NewUser(t, "cag", true)
	bin := openBinary(t)
	for _, p := range agents.All() {
		t.Run(p.Name, func(t *testing.T) {
			modules := requireAgent(t, p)
			for d := filepath.Dir(modules); d != "/"; d = filepath.Dir(d) {
				if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o001 == 0 {
					t.Skipf("SKIPPING: %s is closed to other users, so to the gateway's user", d)
				}
			}
			a := &agentGateway{script: &script{agent: p.Name}, key: randomCanary("provider-key")}
			a.model = modelserver.Start(t, a.script.reply)
			dataDir := userDir(t, u, "data")
			a.c = &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
			a.gw = startAs(t, u, bin, dataDir, "gateway", nil, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir,
				"--provisioner", "local", "--jail-orphan-timeout", "0", "--log-level", "info",
				"--agent-modules", modules, "--agent-endpoint", p.Name+"=http://model.localhost:"+a.model.Addr[strings.LastIndex(a.model.Addr, ":")+1:])
			a.c.load(t)
			a.intern = createAgentIntern(t, a.gw, a.c.WK, p.Name)
			a.putSecret(t, p.KeySecret, "model.localhost", a.key)
			s := a.turn(t, "cohort-say: hello from the test")
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: hello from the test") {
				t.Fatalf("text turn: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
		})
	}
}
