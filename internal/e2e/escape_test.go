package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The escape suite: an intern is hostile. Through the real gateway, its
// jailed daemons and agents, each attempt below runs as a shell command
// (the built-in agent's shell tool in self-drive, in manual mode before
// escalation and after allow_always; and a stand-in third-party agent that
// runs commands with its own tools). Every attempt must fail: its canary
// appears nowhere in the stream, the gateway's logs (the daemons' included)
// or the vault audit, and nothing it tried to write or kill is touched.

// shellAgent builds the stand-in third-party agent once.
func shellAgent(t *testing.T) string {
	return builds.Binary(t, "github.com/cohort-dev/cohort/internal/e2e/testdata/shellagent")
}

func randomCanary(what string) string {
	var b [8]byte
	rand.Read(b[:])
	return "canary-" + what + "-" + hex.EncodeToString(b[:])
}

// target is a jailed gateway with two interns and the secrets an escape
// would be after.
type target struct {
	c        *cluster
	gw       *proc
	dbURL    string
	other    string            // the second intern
	canaries map[string]string // what → a string that must never come out
	attempts []attempt
}

// attempt is one escape: a command, and what would show it worked.
type attempt struct {
	name    string
	command string
	// canaries that must not appear in the output ("what" keys of target.canaries)
	canaries []string
	// extra strings that would prove success
	success []string
	// host files that must not exist afterwards
	untouched []string
	// strings that must appear: the probe ran and saw something
	want []string
}

func newTarget(t *testing.T, dbURL string, serveArgs ...string) *target {
	t.Helper()
	tg := &target{dbURL: dbURL, canaries: map[string]string{}}
	tg.canaries["gateway-env"] = randomCanary("gateway-env")
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	if dbURL != "" {
		c.dbArgs = append(c.dbArgs, "--database-url", dbURL)
	}
	tg.c = c
	tg.gw = c.GatewayEnv(t, []string{"ESCAPE_GATEWAY_CANARY=" + tg.canaries["gateway-env"]},
		append([]string{"--provisioner", "local", "--log-level", "info"}, serveArgs...)...)
	c.load(t)
	tg.canaries["management-key"] = c.MK

	// A second intern, with a world-readable file in its directory: only
	// the jail's mount view keeps it from the first.
	tg.other = createIntern(t, tg.gw, c.MK, c.WS, "other")
	tg.waitRunning(t, c.Demo)
	tg.waitRunning(t, tg.other)
	tg.canaries["other-intern"] = randomCanary("other-intern")
	otherFile := filepath.Join(dataDir, "interns", tg.other, "canary.txt")
	if err := os.WriteFile(otherFile, []byte(tg.canaries["other-intern"]), 0o644); err != nil {
		t.Fatal(err)
	}
	// A vault secret of the attacking intern.
	tg.canaries["vault-value"] = randomCanary("vault-value")
	body := `{"hosts":["api.example.com"],"value":"` + tg.canaries["vault-value"] + `"}`
	req, _ := http.NewRequest("PUT", tg.gw.URL+"/api/v1/vault/interns/"+c.Demo+"/secrets/escape_token", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+c.WK)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("vault put: %v %v", err, res)
	}
	res.Body.Close()

	kek, err := os.ReadFile(filepath.Join(dataDir, "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ks struct {
		Key []struct {
			KeyData struct {
				Value string `json:"value"`
			} `json:"keyData"`
		} `json:"key"`
	}
	if err := json.Unmarshal(kek, &ks); err != nil || len(ks.Key) == 0 || len(ks.Key[0].KeyData.Value) < 24 {
		t.Fatalf("kek.json: %v %s", err, kek)
	}
	tg.canaries["kek"] = ks.Key[0].KeyData.Value[4:24]
	tg.canaries["sqlite"] = "SQLite format 3"
	secret, _ := tg.daemon(t, c.Demo)
	tg.canaries["daemon-secret"] = secret
	_, otherURL := tg.daemon(t, tg.other)
	otherPort := otherURL[strings.LastIndex(otherURL, ":")+1:]

	// $((…)) keeps each success marker out of the command's own text.
	connect := func(port string) string {
		return fmt.Sprintf(`bash -c 'exec 3<>/dev/tcp/127.0.0.1/%s && echo reached-$((1000000+%s))' 2>&1`, port, port)
	}
	// Search the whole view (bind mounts included), not only its root's
	// file system; /proc, /sys and /dev are no file stores, and a gVisor
	// sandbox's view of commands is the same binds again, read-only
	// (ADR 0985): searched once, through the sandbox's own.
	find := func(name, then string) string {
		return `find / \( -path /proc -o -path /sys -o -path /dev -o -path ` + jail.CommandView + ` \) -prune -o -name '` + name + `' -print 2>/dev/null | head -20 | xargs -r ` + then
	}
	d := dataDir
	tg.attempts = []attempt{
		{name: "read the KEK", command: "cat " + d + "/kek.json; " + find("kek.json", "cat"), canaries: []string{"kek"}},
		{name: "read the database", command: "head -c 100 " + d + "/cohort.db; " + find("cohort.db*", "head -c 100"), canaries: []string{"sqlite", "vault-value"}},
		{name: "read bootstrap.json", command: "cat " + d + "/bootstrap.json; " + find("bootstrap.json", "cat"), canaries: []string{"management-key"}},
		{name: "read another intern's directory", command: "cat " + otherFile + "; cat ../../" + tg.other + "/canary.txt; ls /intern/..; " + find("canary.txt", "cat"), canaries: []string{"other-intern"}},
		{name: "read the environ of every process", command: `for p in /proc/[0-9]*; do tr '\0' '\n' < $p/environ; done 2>&1`, canaries: []string{"daemon-secret", "gateway-env"}},
		{name: "read the daemon's memory and descriptors", command: `for p in /proc/[0-9]*; do head -c 100000 $p/mem | strings; ls -l $p/fd; done 2>&1 | head -c 20000`, canaries: []string{"daemon-secret"}},
		{name: "connect to PostgreSQL", command: connect("5432"), success: []string{"reached-1005432"}},
		{name: "connect to Redis", command: connect("6379"), success: []string{"reached-1006379"}},
		{name: "connect to another intern's daemon", command: connect(otherPort), success: []string{fmt.Sprintf("reached-%d", 1000000+atoi(otherPort))}},
		{name: "ask the egress proxy for loopback", command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/7103; printf "CONNECT 127.0.0.1:5432 HTTP/1.1\r\nHost: 127.0.0.1:5432\r\n\r\n" >&3; head -c 40 <&3' 2>&1`, success: []string{"HTTP/1.1 200"}},
		// .localhost names are loopback to the relay (RFC 6761): refused like 127.0.0.1 unless an
		// operator lists a loopback range, which this gateway does not.
		{name: "ask the egress proxy for a .localhost name", command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/7103; printf "CONNECT db.localhost:5432 HTTP/1.1\r\nHost: db.localhost:5432\r\n\r\n" >&3; head -c 40 <&3' 2>&1`, success: []string{"HTTP/1.1 200"}},
		// The gateway's model relay of intern Pods is served only with the Kubernetes
		// provisioner: a jail reaching the gateway's API finds no such path.
		{name: "use the Pods' model relay through the gateway relay", command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/7102; printf "GET /intern-relay/` + tg.c.Demo + `/token/v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ` + agents.KeyPlaceholder + `\r\nConnection: close\r\n\r\n" >&3; head -c 300 <&3' 2>&1`,
			success: []string{"model endpoint", "authentication_error"}},
		// Without tracing there is no trace relay in the jail.
		{name: "reach a trace relay the gateway does not run", command: connect("7104"), success: []string{"reached-1007104"}},
		{name: "write outside the intern's directory", command: "touch " + d + "/pwned " + d + "/interns/" + tg.other + "/pwned /usr/pwned /etc/pwned /pwned 2>&1",
			untouched: []string{d + "/pwned", d + "/interns/" + tg.other + "/pwned", "/usr/pwned", "/etc/pwned", "/pwned"}},
		// Jails outlive their gateway through a control socket in the data
		// directory (--jail-orphan-timeout): taking it over would hand the
		// jail's relays and output to the intern. Both interns' sockets by
		// their host paths, and every descriptor /proc shows.
		{name: "take over a jail's control socket", command: `python3 -c 'import glob, socket
for p in ["` + d + `/jails/` + c.Demo + `.sock", "` + d + `/jails/` + tg.other + `.sock"] + glob.glob("/proc/*/fd/*"):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.settimeout(2); s.connect(p); print("took-" + "over", p, s.recv(100))
    except Exception as e:
        pass
print("tried", p)' 2>&1`, success: []string{"took-over"}},
		// Descriptors: the shell and its parent chain, as far as /proc
		// lets it read them, hold 0-2 and their own close-on-exec
		// descriptors only; every socket it inherited is tried for accept
		// (the daemon's listener, once, was one); no socket bound to a
		// path of the host shows in /proc/net/unix.
		{name: "use an inherited descriptor", command: `python3 -c '` + fdProbe + `' 2>&1`,
			success: []string{"fd-leak", "accepted-on-inherited", "listening-inherited"}, want: []string{"inspected-ok"}},
		{name: "find host paths in /proc/net/unix", command: `awk 'NR>1 && NF>=8 {print "unix-" "path", $8}' /proc/net/unix; grep -c "" /proc/net/unix`,
			success: []string{"unix-path"}},
		procAttempt(),
		hostSocketsAttempt(t, d),
		{name: "signal the gateway", command: fmt.Sprintf("kill -9 %d 2>&1; kill -9 %d 2>&1", tg.gw.cmd.Process.Pid, os.Getpid())},
	}
	return tg
}

// check fails t if out (or the host) shows that a worked.
func (a attempt) check(t *testing.T, mode, out string, canaries map[string]string) {
	t.Helper()
	for _, what := range a.canaries {
		if strings.Contains(out, canaries[what]) {
			t.Errorf("%s / %s: the %s came out:\n%s", mode, a.name, what, tail(out, 2000))
		}
	}
	for _, s := range a.success {
		if strings.Contains(out, s) {
			t.Errorf("%s / %s: it worked (%q):\n%s", mode, a.name, s, tail(out, 2000))
		}
	}
	for _, w := range a.want {
		if !strings.Contains(out, w) {
			t.Errorf("%s / %s: the probe did not run (%q missing):\n%s", mode, a.name, w, tail(out, 2000))
		}
	}
	for _, f := range a.untouched {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s / %s: %s was written", mode, a.name, f)
			os.Remove(f)
		}
	}
}

func atoi(s string) int {
	n := 0
	fmt.Sscan(s, &n)
	return n
}

// createIntern creates an intern through the API (the provisioner starts it).
func createIntern(t *testing.T, gw *proc, mk, ws, name string) string {
	t.Helper()
	return createInternWith(t, gw, mk, `{"workspace_id":"`+ws+`","name":"`+name+`"}`)["id"]
}

// createInternWith posts a CreateIntern body and returns the intern's
// string fields.
func createInternWith(t *testing.T, gw *proc, key, body string) map[string]string {
	t.Helper()
	req, _ := http.NewRequest("POST", gw.URL+"/api/v1/cohort.v1.InternService/CreateIntern", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Intern map[string]any `json:"intern"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != 200 || out.Intern["id"] == nil {
		t.Fatalf("create intern: %d %v", res.StatusCode, err)
	}
	fields := map[string]string{}
	for k, v := range out.Intern {
		if s, ok := v.(string); ok {
			fields[k] = s
		}
	}
	return fields
}

// waitRunning polls until the intern answers a turn.
func (tg *target) waitRunning(t *testing.T, id string) {
	t.Helper()
	testutil.Eventually(t, wait, "intern "+id+" runs", func() bool {
		res := chat(t, tg.gw, tg.c.WK, id, user("ready?x"))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		readAll(t, res)
		return true
	})
}

// daemon reads an intern's daemon secret (unwrapped with the KEK) and URL.
func (tg *target) daemon(t *testing.T, id string) (secret, url string) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, tg.dbURL, tg.c.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var in store.Intern
	if err := db.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	kek, err := envelope.Load(filepath.Join(tg.c.dataDir, "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	ct, _ := base64.StdEncoding.DecodeString(in.DaemonSecret)
	pt, err := kek.Unwrap(ct, []byte("cohort/intern-daemon-secret/"+id))
	if err != nil {
		t.Fatal(err)
	}
	return string(pt), in.DaemonURL
}

// run sends one attempt in a mode and returns everything the caller saw.
func (tg *target) run(t *testing.T, mode, command string, builtin bool) string {
	t.Helper()
	const done = "; echo attempt-$((40+2))"
	prompt := command + done
	if builtin {
		prompt = "$ " + prompt
	}
	var s *stream
	switch mode {
	case "self-drive":
		s = readAll(t, chat(t, tg.gw, tg.c.WK, tg.c.Demo, user(prompt)))
	default:
		p := readAll(t, chat(t, tg.gw, tg.c.WK, tg.c.Demo, user(prompt, `"approval_mode":"manual"`)))
		if !builtin {
			s = p // the stand-in asks nothing
			break
		}
		if p.Finish != "tool_calls" {
			t.Fatalf("%s: no pause: %q %s", mode, p.Finish, p.Text)
		}
		answer := map[string]string{"manual, before escalation": "allow_once", "manual, escalated": "allow_always"}[mode]
		s = readAll(t, chat(t, tg.gw, tg.c.WK, tg.c.Demo, p.answer(answer)))
	}
	raw, _ := json.Marshal(s.Chunks)
	out := s.Text + string(raw)
	if !strings.Contains(s.Text, "attempt-42") {
		t.Fatalf("the attempt did not run to its end (so it proves nothing): finish %q text %q", s.Finish, s.Text)
	}
	return out
}

func TestEscape(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		for _, agent := range []string{"built-in", "third-party"} {
			t.Run(db+"/"+agent, func(t *testing.T) {
				t.Parallel()
				dbURL := ""
				if db == "postgres" {
					dbURL = storetest.PostgresURL(t)
				}
				var args []string
				modes := []string{"self-drive", "manual, before escalation", "manual, escalated"}
				builtin := agent == "built-in"
				if !builtin {
					bin := shellAgent(t)
					args = []string{"--agent-command", bin, "--jail-ro-bind", filepath.Dir(bin)}
					modes = []string{"self-drive", "manual"}
				}
				stray := strayDescriptor(t)
				tg := newTarget(t, dbURL, args...)
				var outputs []string
				for _, mode := range modes {
					// Every process of the jail, a command of this mode's
					// among them, holds only its documented descriptors.
					checkFDsDuring(t, tg.gw.cmd.Process.Pid, mode, "sleep", stray, false, func() { tg.run(t, mode, "sleep 3", builtin) })
					for _, a := range tg.attempts {
						out := tg.run(t, mode, a.command, builtin)
						outputs = append(outputs, out)
						a.check(t, mode, out, tg.canaries)
					}
				}
				// The gateway survived its signal, and nothing of it leaked
				// anywhere: streams, logs, audit.
				select {
				case <-tg.gw.done:
					t.Fatal("the gateway died")
				default:
				}
				tg.waitRunning(t, tg.other)
				time.Sleep(200 * time.Millisecond) // the daemons' last log lines
				audit, _ := tg.c.admin("vault", "audit", "--org", tg.c.Org, "--json")
				everything := strings.Join(outputs, "\n") + tg.gw.stderr.String() + string(audit)
				for what, canary := range tg.canaries {
					if what == "sqlite" {
						continue // the gateway's own logs may name its database
					}
					if strings.Contains(everything, canary) {
						t.Errorf("the %s canary appeared in a stream, log or audit", what)
					}
				}
			})
		}
	}
}

// `cohort intern --jail`: two daemons an operator runs on one host, each in
// its own jail. The first one's agent cannot read either daemon's secret
// file, the other's directory, the gateway's data directory, nor connect
// to the other daemon or the host's loopback services.
func TestRemoteDaemonJail(t *testing.T) {
	t.Parallel()
	c, gw := newCluster(t, "")
	other := c.NewIntern(t, "other")
	gwAPI := gw.URL + "/api/v1"
	stray := strayDescriptor(t)
	a := c.Daemon(t, c.Demo, nil, "--jail", "--gateway-url", gwAPI)
	b := c.Daemon(t, other, nil, "--jail", "--gateway-url", gwAPI)
	canaries := map[string]string{"own-secret": "daemon-secret-" + a.id, "other-secret": "daemon-secret-" + b.id,
		"other-intern": randomCanary("other-intern"), "management-key": c.MK}
	if err := os.WriteFile(filepath.Join(b.dataDir, "canary.txt"), []byte(canaries["other-intern"]), 0o644); err != nil {
		t.Fatal(err)
	}
	port := b.URL[strings.LastIndex(b.URL, ":")+1:]
	attempts := []attempt{
		{name: "read the secret files", command: "cat " + a.secretFile + " " + b.secretFile + " 2>&1", canaries: []string{"own-secret", "other-secret"}},
		{name: "read the environ and memory of every process", command: `for p in /proc/[0-9]*; do tr '\0' '\n' < $p/environ; head -c 100000 $p/mem | strings; done 2>&1 | head -c 20000`, canaries: []string{"own-secret"}},
		{name: "read the other daemon's directory", command: "cat " + b.dataDir + "/canary.txt 2>&1", canaries: []string{"other-intern"}},
		{name: "read the gateway's data", command: "cat " + c.dataDir + "/bootstrap.json 2>&1", canaries: []string{"management-key"}},
		{name: "connect to the other daemon", command: fmt.Sprintf(`bash -c 'exec 3<>/dev/tcp/127.0.0.1/%s && echo reached-$((1000000+%s))' 2>&1`, port, port),
			success: []string{fmt.Sprintf("reached-%d", 1000000+atoi(port))}},
		{name: "connect to PostgreSQL", command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/5432 && echo reached-$((1000000+5432))' 2>&1`, success: []string{"reached-1005432"}},
		{name: "write outside its directory", command: "touch " + b.dataDir + "/pwned 2>&1", untouched: []string{b.dataDir + "/pwned"}},
	}
	for _, at := range attempts {
		s := readAll(t, chat(t, gw, c.WK, a.id, user("$ "+at.command+"; echo attempt-$((40+2))")))
		raw, _ := json.Marshal(s.Chunks)
		out := s.Text + string(raw)
		if !strings.Contains(s.Text, "attempt-42") {
			t.Fatalf("%s did not run to its end: %q", at.name, s.Text)
		}
		at.check(t, "intern --jail", out, canaries)
	}
	// What the operator's process inherited reaches nothing in the jail.
	checkFDsDuring(t, a.cmd.Process.Pid, "intern --jail", "sleep", stray, false, func() {
		readAll(t, chat(t, gw, c.WK, a.id, user("$ sleep 3")))
	})
	// Manual mode still pauses and the allowed command runs, sandboxed.
	p := readAll(t, chat(t, gw, c.WK, a.id, user("$ echo jailed-remote", `"approval_mode":"manual"`)))
	r := readAll(t, chat(t, gw, c.WK, a.id, p.answer("allow_once")))
	if p.Finish != "tool_calls" || r.Finish != "stop" || !strings.Contains(r.Text, "jailed-remote") {
		t.Fatalf("manual turn: %q then %q %q", p.Finish, r.Finish, r.Text)
	}
	for _, d := range []*daemon{a, b} {
		if strings.Contains(d.stderr.String(), "daemon-secret-") {
			t.Errorf("a daemon secret reached the daemon's log")
		}
	}
}

// fdProbe runs in a jail's shell (Python, single-quote free): it prints
// fd-leak for a descriptor above 2 without close-on-exec in itself or any
// process up its parent chain it may read (those it did not open itself:
// what it inherited), tries to accept on every socket it inherited, and
// prints inspected-ok once it has read its own and its parent's. Markers
// are built from halves so that the command's text never holds them.
const fdProbe = `import os, socket, select
leak = "fd" + "-leak"
read = 0
p = os.getpid()
while p > 0:
    try:
        fds = os.listdir("/proc/%d/fd" % p)
        read += 1
    except Exception as e:
        print("unreadable", p, type(e).__name__)
        fds = []
    for fd in fds:
        try:
            info = open("/proc/%d/fdinfo/%s" % (p, fd)).read()
            flags = int([l for l in info.splitlines() if l.startswith("flags:")][0].split()[1], 8)
            target = os.readlink("/proc/%d/fd/%s" % (p, fd))
        except Exception:
            continue
        if int(fd) > 2 and not flags & 0o2000000:
            print(leak, "pid", p, "fd", fd, target)
    try:
        p = int(open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[1])
    except Exception:
        break
for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
    try:
        if fd < 3 or not os.get_inheritable(fd):
            continue
        s = socket.socket(fileno=os.dup(fd))
    except Exception:
        continue
    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        print("listening" + "-inherited", fd, s.getsockname())
        s.setblocking(False)
        if select.select([s], [], [], 2)[0]:
            c, a = s.accept()
            print("accepted-on" + "-inherited", fd, a, c.recv(200))
if read >= 2:
    print("inspected" + "-ok", read)
`

// strayDescriptor gives this test process a pipe without close-on-exec,
// as a gateway inherits one from whatever started it: every process this
// one starts from now on (the gateways) holds it. It returns the pipe's
// inode: no process in a jail may hold it.
func strayDescriptor(t *testing.T) uint64 {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(w.Fd())) // dup(2) leaves close-on-exec off
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Fstat(fd, &st)
	t.Cleanup(func() {
		syscall.Close(fd)
		r.Close()
	})
	return st.Ino
}

// nsIno is the inode of a namespace of pid (0 if it cannot be read).
func nsIno(pid int, ns string) uint64 {
	st, err := os.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// procTree reads every process's parent and name.
func procTree() (parent map[int]int, comm map[int]string) {
	parent, comm = map[int]int{}, map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		open, close := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(string(b[close+1:]))
		if len(f) < 2 {
			continue
		}
		parent[pid] = atoi(f[1])
		comm[pid] = string(b[open+1 : close])
	}
	return parent, comm
}

// jailed returns the processes under root whose network namespace is not
// root's: everything in its jails (with all, every process under root).
func jailed(root int, all bool) (pids []int, parent map[int]int, comm map[int]string) {
	parent, comm = procTree()
	children := map[int][]int{}
	for pid, pp := range parent {
		children[pp] = append(children[pp], pid)
	}
	hostNet := nsIno(root, "net")
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			queue = append(queue, c)
			if n := nsIno(c, "net"); all || (n != 0 && n != hostNet) {
				pids = append(pids, c)
			}
		}
	}
	sort.Ints(pids)
	return pids, parent, comm
}

// fdViolations checks the descriptor invariant in every process of the
// jails under root (a gateway, or `cohort intern --jail`), seen from the
// host, where nothing hides a process's descriptors:
//   - no process of Cohort's (init, daemon, built-in agent), shell or the
//     command itself (named command) holds a descriptor above 2 without
//     close-on-exec: what such a process has that it did not open itself
//     came across exec, and only 0-2 may (the daemon's listener and secret
//     pipe, 3 and 4, are closed at once). A third-party agent's runtime
//     opens files of its own without the flag (a log, /dev/urandom, a pty):
//     for it only the next two rules hold, and what it inherited would
//     show in the command it starts;
//   - no process holds the pipe stray (the gateway's inherited descriptor);
//   - no socket is in another network namespace than its process, except
//     in a jail's init (its caller's socket pair, the control listener)
//     and in the intern's daemon (its listener and the gateway's
//     connections, on the host's loopback: by design, the gateway's way in).
//
// With all, it checks every process under root (an unjailed daemon's
// agent and commands). It returns the violations and what it looked at.
func fdViolations(root int, stray uint64, all bool, command string) (violations, seen []string) {
	pids, parent, comm := jailed(root, all)
	hostNet := nsIno(root, "net")
	for _, pid := range pids {
		pp := parent[pid]
		init := nsIno(pid, "pid") != nsIno(pp, "pid")
		daemon := !init && nsIno(pp, "pid") != nsIno(parent[pp], "pid") && nsIno(parent[pp], "net") == hostNet
		role := map[bool]string{true: "init"}[init] + map[bool]string{true: "daemon"}[daemon]
		strict := init || daemon || comm[pid] == command || slices.Contains([]string{"cohort", "sh", "bash", "dash"}, comm[pid])
		who := fmt.Sprintf("pid %d (%s%s)", pid, comm[pid], map[bool]string{true: ", " + role}[role != ""])
		seen = append(seen, who)
		netns := nsIno(pid, "net")
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // gone
		}
		for _, e := range fds {
			fd := atoi(e.Name())
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
			if err != nil {
				continue
			}
			info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
			if err != nil {
				continue
			}
			var flags uint64
			for _, l := range strings.Split(string(info), "\n") {
				if v, ok := strings.CutPrefix(l, "flags:"); ok {
					flags, _ = strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				}
			}
			if strict && fd > 2 && flags&unix.O_CLOEXEC == 0 {
				violations = append(violations, fmt.Sprintf("%s holds fd %d → %s without close-on-exec (inherited)", who, fd, target))
			}
			if target == fmt.Sprintf("pipe:[%d]", stray) {
				violations = append(violations, fmt.Sprintf("%s holds fd %d, the gateway's inherited pipe", who, fd))
			}
			if strings.HasPrefix(target, "socket:") && !init && !daemon {
				if ns, err := socketNetNS(pid, fd); err == nil && ns != netns {
					violations = append(violations, fmt.Sprintf("%s holds fd %d → %s, a socket of another network namespace", who, fd, target))
				}
			}
		}
	}
	return violations, seen
}

// checkFDsDuring runs run (a turn whose command, named comm, sleeps) and
// checks the descriptor invariant under root while the command runs:
// every process of the jail (or with all, under root), the command's own
// included.
func checkFDsDuring(t *testing.T, root int, label, comm string, stray uint64, all bool, run func()) {
	t.Helper()
	checkFDsDuringOf(t, func() int { return root }, label, comm, stray, all, run)
}

// checkFDsDuringOf is checkFDsDuring with a root found while run runs
// (0: not yet).
func checkFDsDuringOf(t *testing.T, rootOf func() int, label, comm string, stray uint64, all bool, run func()) {
	t.Helper()
	type result struct{ violations, seen []string }
	done, got := make(chan struct{}), make(chan result, 1)
	go func() {
		for {
			root := rootOf()
			pids, _, names := jailed(root, all)
			if root == 0 {
				pids = nil
			}
			for _, p := range pids {
				if names[p] == comm {
					v, s := fdViolations(root, stray, all, comm)
					got <- result{v, s}
					return
				}
			}
			select {
			case <-done:
				got <- result{}
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	run()
	close(done)
	r := <-got
	if len(r.seen) == 0 {
		t.Errorf("%s: the command %q was never seen running", label, comm)
		return
	}
	t.Logf("%s: descriptors checked in %s", label, strings.Join(r.seen, "; "))
	for _, v := range r.violations {
		t.Errorf("%s: %s", label, v)
	}
}

// The attack of issue 26: a program in a jail captured what the gateway
// presents to an intern's daemon (it accepted on the daemon's listener,
// which it had inherited, and read the Authorization header) and replayed
// it to the gateway's ReleaseSecret as the daemon. Here the daemon is this
// test's own, registered as a remote daemon, and it records every header
// the gateway (and the admin CLI) present: each one replayed is refused,
// while the daemon's own credential is answered (the refusal is not the
// endpoint's absence). Local jails and Pods are dialled by the same code.
func TestEscapeReplayGatewayCredential(t *testing.T) {
	t.Parallel()
	c, gw := newCluster(t, "")
	id := c.NewIntern(t, "replay")
	secret := randomCanary("replay-daemon-secret")
	d, err := internd.New(internd.Config{InternID: id, Secret: secret, DataDir: t.TempDir(), AgentCommand: []string{"/nonexistent/agent"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var mu sync.Mutex
	captured := map[string]bool{}
	h := d.Handler()
	srv := testutil.ServeH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		captured[r.Header.Get("Authorization")] = true
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := writeFile(secretFile, secret); err != nil {
		t.Fatal(err)
	}
	if in := c.Admin(t, "intern", "register", "--id", id, "--url", srv.URL, "--secret-file", secretFile); in["state"] != "running" {
		t.Fatalf("register: %v", in)
	}
	value := randomCanary("replay-vault-value")
	req, _ := http.NewRequest("PUT", gw.URL+"/api/v1/vault/interns/"+id+"/secrets/replay_token",
		strings.NewReader(`{"hosts":["api.example.com"],"value":"`+value+`"}`))
	req.Header.Set("Authorization", "Bearer "+c.WK)
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 201 {
		t.Fatalf("vault put: %v %v", err, res)
	} else {
		res.Body.Close()
	}
	// A turn: the gateway itself dials the daemon (its agent does not
	// start; the call's header is what counts).
	res := chat(t, gw, c.WK, id, user("hello"))
	io.Copy(io.Discard, res.Body)
	res.Body.Close()

	release := func(header string) (int, string) {
		req, _ := http.NewRequest("POST", gw.URL+"/api/v1/cohort.v1.InternGatewayService/ReleaseSecret",
			strings.NewReader(`{"internId":"`+id+`","name":"replay_token","host":"api.example.com","runId":"run-1"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", header)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	mu.Lock()
	headers := slices.Collect(maps.Keys(captured))
	mu.Unlock()
	if len(headers) == 0 || (len(headers) == 1 && headers[0] == "") {
		t.Fatal("the daemon saw no credential from the gateway")
	}
	for _, hdr := range headers {
		if status, body := release(hdr); status != http.StatusUnauthorized || strings.Contains(body, value) {
			t.Errorf("the gateway's credential, replayed to ReleaseSecret: %d %s", status, body)
		}
	}
	if status, body := release("Bearer " + launch.DaemonCredential(secret)); status != 200 || !strings.Contains(body, value) {
		t.Errorf("the daemon's own credential: %d %s", status, body)
	}
	if strings.Contains(gw.stderr.String(), secret) || strings.Contains(gw.stderr.String(), value) {
		t.Error("the daemon secret or the vault value reached the gateway's log")
	}
}

// An unjailed daemon an operator runs (`cohort intern`, registered): its
// agent and the agent's commands get 0-2 only, whatever the operator's
// process inherited.
func TestEscapeRemoteDaemonDescriptors(t *testing.T) {
	t.Parallel()
	c, gw := newCluster(t, "")
	stray := strayDescriptor(t)
	d := c.Daemon(t, c.Demo, nil, "--gateway-url", gw.URL+"/api/v1")
	checkFDsDuring(t, d.cmd.Process.Pid, "intern", "sleep", stray, true, func() {
		s := readAll(t, chat(t, gw, c.WK, d.id, user("$ sleep 3; echo slept-$((40+2))")))
		if !strings.Contains(s.Text, "slept-42") {
			t.Errorf("the command did not run: %q", s.Text)
		}
	})
}

// hostSocketsAttempt connects to every unix socket the host listens on at a
// path: the well-known services' (PostgreSQL, MariaDB, Docker, D-Bus,
// systemd) and the gateway's own, under its data directory and the gvisor
// backend's sandbox directories (the other intern's daemon and relays),
// found by the same globs inside the intern as on the host. A gvisor
// sandbox runs with --host-uds=all (ADR 0981), so only its view of the file
// system keeps these out of reach. The host must have at least one, or the
// probe proves nothing.
func hostSocketsAttempt(t *testing.T, dataDir string) attempt {
	t.Helper()
	known := []string{
		"/var/run/postgresql/.s.PGSQL.5432", "/run/postgresql/.s.PGSQL.5432",
		"/run/mysqld/mysqld.sock", "/var/run/mysqld/mysqld.sock",
		"/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
		"/run/dbus/system_bus_socket", "/run/systemd/private", "/run/systemd/journal/socket", "/dev/log",
		"/var/run/redis/redis-server.sock",
	}
	globs := []string{dataDir + "/*/*.sock", dataDir + "/*/*/*.sock", os.TempDir() + "/cohort-gvisor-*/*/*/*.sock"}
	found := 0
	candidates := slices.Clone(known)
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		candidates = append(candidates, m...)
	}
	for _, p := range candidates {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
			found++
		}
	}
	if found == 0 {
		t.Fatalf("the host has none of the unix sockets the escape suite tries: %q", candidates)
	}
	k, _ := json.Marshal(known)
	g, _ := json.Marshal(globs)
	return attempt{name: "connect to the host's unix sockets", command: `python3 -c 'import glob, socket
paths = ` + string(k) + `
for g in ` + string(g) + `:
    paths += glob.glob(g)
for p in paths:
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
        try:
            s = socket.socket(socket.AF_UNIX, kind); s.settimeout(2); s.connect(p); print("reached" + "-uds", p); break
        except Exception as e:
            pass
print("probed-" + "uds")' 2>&1`,
		success: []string{"reached-uds"}, want: []string{"probed-uds"}}
}
