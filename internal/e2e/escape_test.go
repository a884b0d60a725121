package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/storetest"
	"github.com/cohort-dev/cohort/internal/testutil"
)

// The escape suite: an intern is hostile. Through the real gateway, its
// jailed daemons and agents, each attempt below runs as a shell command
// (the built-in agent's shell tool in self-drive, in manual mode before
// escalation and after allow_always; and a stand-in third-party agent that
// runs commands with its own tools). Every attempt must fail: its canary
// appears nowhere in the stream, the gateway's logs (the daemons' included)
// or the vault audit, and nothing it tried to write or kill is touched.

var (
	shellAgentOnce sync.Once
	shellAgentBin  string
	shellAgentErr  error
)

// shellAgent builds the stand-in third-party agent once.
func shellAgent(t *testing.T) string {
	t.Helper()
	shellAgentOnce.Do(func() {
		dir := filepath.Join(e2eDir, "agents")
		shellAgentBin = filepath.Join(dir, "shellagent")
		out, err := exec.Command("go", "build", "-o", shellAgentBin, "github.com/cohort-dev/cohort/internal/e2e/testdata/shellagent").CombinedOutput()
		if err != nil {
			shellAgentErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if shellAgentErr != nil {
		t.Fatal(shellAgentErr)
	}
	return shellAgentBin
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
	// file system; /proc, /sys and /dev are no file stores.
	find := func(name, then string) string {
		return `find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name '` + name + `' -print 2>/dev/null | head -20 | xargs -r ` + then
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
		{name: "use the Pods' model relay through the gateway relay", command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/7102; printf "GET /intern-relay/` + tg.c.Demo + `/token/v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ` + provision.KeyPlaceholder + `\r\nConnection: close\r\n\r\n" >&3; head -c 300 <&3' 2>&1`,
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
				tg := newTarget(t, dbURL, args...)
				var outputs []string
				for _, mode := range modes {
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
