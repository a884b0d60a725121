package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// cohortBin is the real cohort executable, built once by TestMain: the
// gateway, the daemons, their agents and the admin CLI all run as the
// processes an operator would run.
var cohortBin string

// e2eDir holds the binaries the tests build: cohort in bin/ (which jails
// hide, as the gateway's binary directory), stand-in agents beside it.
var e2eDir string

// builds are the stand-in agents, built into e2eDir/agents when a test
// first needs one.
var builds testutil.Builds

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cohort-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e2eDir = dir
	builds.Dir = filepath.Join(dir, "agents")
	cohortBin = filepath.Join(dir, "bin", "cohort")
	// cohort-intern beside it, as they ship: the gateway's local interns
	// run from it.
	for _, cmd := range []string{"cohort", "cohort-intern"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", cmd), "github.com/cohort-dev/cohort/cmd/"+cmd)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build "+cmd+":", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	if err := checkOpenAPI(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	openAPISummary()
	os.RemoveAll(dir)
	os.Exit(code)
}

// wait bounds every wait of these tests: generous, since a loaded 2-core
// machine runs gateways, daemons and agents side by side.
const wait = 60 * time.Second

// proc is a child process that announced its address on stdout.
type proc struct {
	name   string
	cmd    *exec.Cmd
	URL    string
	stderr *testutil.SyncBuffer
	done   chan struct{}

	stopping atomic.Bool // Stop or Kill has been called: an exit then is no news
	exit     string      // how it ended; set before done closes
	reported atomic.Bool // its stderr has been logged for a failed test
}

// wait waits for the process, records how it ended, and closes done.
func (p *proc) wait() {
	start := time.Now()
	err := p.cmd.Wait()
	how := "exited"
	if ps := p.cmd.ProcessState; ps != nil {
		how = ps.String()
	} else if err != nil {
		how = err.Error()
	}
	who := "on its own, before the test stopped it"
	if p.stopping.Load() {
		who = "stopped by the test"
	}
	p.exit = fmt.Sprintf("pid %d: %s after %s (%s)", p.cmd.Process.Pid, how, time.Since(start).Round(time.Millisecond), who)
	close(p.done)
}

var addrRE = regexp.MustCompile(`listening on (http://\S+)`)

// start runs cohort with args and env and waits for its address line.
func start(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	return startIn(t, "", name, env, args...)
}

// startIn is start in the working directory dir ("" for this one).
func startIn(t testing.TB, dir, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(cohortBin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	return startCmd(t, name, cmd)
}

// startCmd starts a prepared `cohort` command and waits for the address it
// prints.
func startCmd(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
	}()
	go p.wait()
	t.Cleanup(func() { p.Stop(t) })
	select {
	case p.URL = <-addr:
	case <-p.done:
		t.Fatalf("%s exited before listening: %s\n%s", name, p.exit, p.stderr)
	case <-time.After(wait):
		t.Fatalf("%s did not listen within %v:\n%s", name, wait, p.stderr)
	}
	if name == "gateway" {
		watchGateway(t, p)
	}
	return p
}

// Stop ends the process gracefully (SIGTERM), then by force. In a failed test it logs how
// the process ended (by itself, or stopped here) and the tail of its stderr.
func (p *proc) Stop(t testing.TB) {
	select {
	case <-p.done:
	default:
		p.stopping.Store(true)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if t.Failed() && !p.reported.Swap(true) {
		t.Logf("%s %s; stderr:\n%s", p.name, p.exit, tail(p.stderr.String(), 4000))
		// The whole log, for failures whose cause is further back than the tail.
		if dir := os.Getenv("COHORT_E2E_LOGS"); dir != "" {
			f := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+p.name+".log")
			if err := os.WriteFile(f, []byte(p.stderr.String()), 0o644); err == nil {
				t.Logf("%s stderr in full: %s", p.name, f)
			}
		}
	}
}

// Kill ends the process at once (SIGKILL) and waits for it.
func (p *proc) Kill() {
	p.stopping.Store(true)
	p.cmd.Process.Kill()
	<-p.done
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// cleanEnv is this process's environment without COHORT_*, OPENAI_* and
// OTEL_* settings, so a developer's shell cannot change what the tests
// start.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COHORT_") && !strings.HasPrefix(kv, "OPENAI_") && !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return out
}

// cluster is one database with the gateways serving it.
type cluster struct {
	dataDir string
	dbArgs  []string
	Org     string
	WS      string
	WK      string // workspace key
	MK      string // management key
	Demo    string // bootstrap intern

	// adminMu serializes admin CLI runs: each migrates the database on
	// open, and concurrent migrations refuse each other's lock.
	adminMu sync.Mutex
}

// newCluster prepares a data directory (KEK, SQLite or dbURL) and starts the
// first gateway with extra serve flags; it bootstraps the organization.
func newCluster(t testing.TB, dbURL string, serveArgs ...string) (*cluster, *proc) {
	t.Helper()
	c := &cluster{dataDir: t.TempDir()}
	c.dbArgs = []string{"--data-dir", c.dataDir}
	if dbURL != "" {
		c.dbArgs = append(c.dbArgs, "--database-url", dbURL)
	}
	g := c.Gateway(t, serveArgs...)
	c.load(t)
	return c, g
}

// load reads the bootstrap file the first gateway wrote.
func (c *cluster) load(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dataDir, "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]string
	if err := json.Unmarshal(b, &boot); err != nil {
		t.Fatal(err)
	}
	c.Org, c.WS, c.WK, c.MK, c.Demo = boot["organization_id"], boot["workspace_id"], boot["workspace_key"], boot["management_key"], boot["intern_id"]
}

// Gateway starts one `cohort serve` on the cluster's database with the
// remote provisioner unless serveArgs say otherwise.
func (c *cluster) Gateway(t testing.TB, serveArgs ...string) *proc {
	t.Helper()
	return c.GatewayEnv(t, nil, serveArgs...)
}

// GatewayEnv is Gateway with extra environment for the gateway process.
func (c *cluster) GatewayEnv(t testing.TB, env []string, serveArgs ...string) *proc {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "warn"}, c.dbArgs...)
	if !hasFlag(serveArgs, "--provisioner") {
		args = append(args, "--provisioner", "remote")
	}
	if !hasFlag(serveArgs, "--jail-orphan-timeout") {
		// A test's jails end with its gateways, unless the test is about
		// jails that outlive them.
		args = append(args, "--jail-orphan-timeout", "0")
	}
	return start(t, "gateway", env, append(args, serveArgs...)...)
}

func hasFlag(args []string, f string) bool {
	for _, a := range args {
		if a == f || strings.HasPrefix(a, f+"=") {
			return true
		}
	}
	return false
}

// Admin runs `cohort admin …` on the cluster's database and decodes --json.
func (c *cluster) Admin(t testing.TB, args ...string) map[string]any {
	t.Helper()
	out, err := c.admin(append(args, "--json")...)
	if err != nil {
		t.Fatalf("admin %v: %v", args, err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("admin %v: %s", args, out)
	}
	return m
}

func (c *cluster) admin(args ...string) ([]byte, error) {
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	cmd := exec.Command(cohortBin, append(append([]string{"admin"}, args...), c.dbArgs...)...)
	cmd.Env = cleanEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w: %s", err, stderr.String())
	}
	return out, nil
}

// NewIntern creates an intern record (state provisioning until a daemon is
// registered for it).
func (c *cluster) NewIntern(t testing.TB, name string) string {
	t.Helper()
	return c.Admin(t, "intern", "create", "--org", c.Org, "--workspace", c.WS, "--name", name)["id"].(string)
}

// daemon is a `cohort intern` process registered for an intern.
type daemon struct {
	*proc
	id, secretFile, dataDir string
	env, flags              []string
}

// Daemon starts `cohort intern` for id with extra flags and agent
// environment, and registers it with `cohort admin intern register`.
func (c *cluster) Daemon(t testing.TB, id string, env []string, flags ...string) *daemon {
	t.Helper()
	d := &daemon{id: id, dataDir: t.TempDir(), env: env, flags: flags}
	d.secretFile = filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(d.secretFile, []byte("daemon-secret-"+id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.proc = d.run(t, "127.0.0.1:0")
	c.Register(t, d)
	return d
}

func (d *daemon) run(t testing.TB, listen string) *proc {
	// Unjailed, the secret comes in the environment (a file would be the
	// agent's to read: --secret-file needs --jail).
	secret, err := os.ReadFile(d.secretFile)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"intern", "--listen", listen, "--data-dir", d.dataDir, "--intern-id", d.id,
		"--log-level", "warn"}, d.flags...)
	return start(t, "daemon "+d.id, append([]string{"COHORT_INTERN_SECRET=" + strings.TrimSpace(string(secret))}, d.env...), args...)
}

// Restart starts the daemon again on the same address and data directory.
func (d *daemon) Restart(t testing.TB) {
	t.Helper()
	d.proc.Stop(t)
	d.proc = d.run(t, strings.TrimPrefix(d.URL, "http://"))
}

// Register records d's address and secret for its intern.
func (c *cluster) Register(t testing.TB, d *daemon) {
	t.Helper()
	in := c.Admin(t, "intern", "register", "--id", d.id, "--url", d.URL, "--secret-file", d.secretFile)
	if in["state"] != "running" {
		t.Fatalf("register: %v", in)
	}
}

// chat posts a chat request to a gateway.
func chat(t testing.TB, gw *proc, key, intern, body string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	t.Cleanup(cancel)
	return chatCtx(t, ctx, gw, key, intern, body)
}

func chatCtx(t testing.TB, ctx context.Context, gw *proc, key, intern, body string) *http.Response {
	t.Helper()
	return chatVia(t, ctx, http.DefaultClient, gw, key, intern, body)
}

// hangUp is a client whose connection closes with each response: a caller
// that leaves once it has read the stream.
var hangUp = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func chatVia(t testing.TB, ctx context.Context, client *http.Client, gw *proc, key, intern, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL+"/api/v1/interns/"+intern+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// refusal asserts a JSON refusal with status and reason.
func refusal(t testing.TB, res *http.Response, status int, reason string) {
	t.Helper()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != status || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("want %d %s, got %d %s: %s", status, reason, res.StatusCode, res.Header.Get("Content-Type"), raw)
	}
	var body struct {
		Error struct {
			Code     int    `json:"code"`
			Message  string `json:"message"`
			Metadata struct {
				Reason string `json:"reason"`
			} `json:"metadata"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Error.Code != status || body.Error.Message == "" || body.Error.Metadata.Reason != reason {
		t.Fatalf("want %d %s, got body %s (%v)", status, reason, raw, err)
	}
}

// user and reply build request bodies.
func user(prompt string, extra ...string) string {
	b, _ := json.Marshal(prompt)
	return `{"stream":true` + join(extra) + `,"messages":[{"role":"user","content":` + string(b) + `}]}`
}

func reply(session, callID, content string, extra ...string) string {
	s, _ := json.Marshal(session)
	id, _ := json.Marshal(callID)
	c, _ := json.Marshal(content)
	return `{"stream":true,"session_id":` + string(s) + join(extra) + `,"messages":[{"role":"tool","tool_call_id":` + string(id) + `,"content":` + string(c) + `}]}`
}

func join(extra []string) string {
	if len(extra) == 0 {
		return ""
	}
	return "," + strings.Join(extra, ",")
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s+"\n"), 0o600) }
