// Package provisiontest is the backend conformance suite: one table of
// lifecycle steps (create, turn, sleep, wake with files and session intact,
// model change, suspend and resume, a daemon's crash, a gateway restart with
// adoption, two replicas racing to wake one intern, delete), run in order
// by the real reconciler against a real gateway. A backend runs it from its
// own package's tests by implementing Host; tests import it, nothing else.
package provisiontest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// WaitLimit bounds every wait of the suite for the fleet to act.
const WaitLimit = 45 * time.Second

// Host is one backend kind under the suite: what outlives one gateway (a
// machine's jails, a cluster, an operator's daemons) and the backends each
// gateway opens on it.
type Host interface {
	// Backend is one gateway's backend on this host: a restarted gateway
	// or a second replica opens another.
	Backend(t *testing.T) provision.Backend
	// Hosts reports whether the backend starts daemons itself (remote's
	// are the operator's: the suite registers them).
	Hosts() bool
	// Replicas reports whether gateways on two machines may share it
	// (local jails are one machine's, one gateway's).
	Replicas() bool
	// Outlives reports whether its daemons outlive their gateway, for the
	// next to adopt (unjailed children die with theirs).
	Outlives() bool
	// Register has the operator run and register the intern's daemon
	// (for a backend that does not host: Hosts false).
	Register(t *testing.T, p *provision.Provisioner, id string)
	// Crash ends the intern's daemon behind the gateway's back.
	Crash(t *testing.T, b provision.Backend, id string)
	// GatewayAt says where the gateway under test listens (before the
	// first Backend).
	GatewayAt(url string)
	// Kept reports whether the intern's files are on the host.
	Kept(id string) bool
	// Done lets the host's daemons go at the end of the test.
	Done(b provision.Backend)
}

// Run runs the lifecycle table, in order, against a fresh gateway on
// SQLite whose fleet uses newHost's backends. It stops at the first step
// that fails: each step starts where the previous one left the fleet. Run
// does not call t.Parallel: the caller may.
func Run(t *testing.T, newHost func(t *testing.T) Host) {
	t.Helper()
	h := newHost(t)
	db := storetest.SQLite(t)
	f := &fleet{h: h, db: db}
	f.e = testenv.New(t, db, func(s *server.Server) {})
	f.id = f.e.InternID
	h.GatewayAt(f.e.URL)
	f.serve(newFleet(t, f.e, h.Backend(t)))
	t.Cleanup(func() {
		h.Done(f.prov.Backend)
		f.prov.Close()
		if t.Failed() {
			l := f.e.Logs()
			t.Logf("gateway log (tail):\n%s", l[max(0, len(l)-6000):])
		}
	})
	for _, step := range lifecycle {
		if !t.Run(step.name, func(t *testing.T) { step.run(t, f) }) {
			t.FailNow()
		}
	}
}

// fleet is the gateway under test and its fleet.
type fleet struct {
	h    Host
	e    *testenv.Env
	db   *bun.DB
	prov *provision.Provisioner
	id   string
}

func newFleet(t *testing.T, e *testenv.Env, b provision.Backend) *provision.Provisioner {
	t.Helper()
	p := &provision.Provisioner{DB: e.DB, KEK: e.Server.KEK, Log: e.Server.Log, Backend: b,
		RestartBackoff: 100 * time.Millisecond, Sweep: 100 * time.Millisecond}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// serve makes p the gateway's fleet (its API hook and chat's dialer).
func (f *fleet) serve(p *provision.Provisioner) {
	f.prov = p
	f.e.Server.Provisioner, f.e.Server.Interns.Lifecycle, f.e.Server.Chat.Daemons = p, p, p
}

// observed is what the backend sees of the intern: a daemon, its files.
func observed(b provision.Backend, id string) (running, present bool) {
	obs, _ := b.Observe()
	for _, o := range obs {
		if o.ID == id {
			return o.Running, true
		}
	}
	return false, false
}

func (f *fleet) intern(t *testing.T) *store.Intern {
	t.Helper()
	var in store.Intern
	if err := f.db.NewSelect().Model(&in).Where("id = ?", f.id).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &in
}

func (f *fleet) state(t *testing.T) string { return f.intern(t).State }

// model is what the intern's daemon answers it runs ("" if it does not).
func (f *fleet) model(t *testing.T) string {
	c, err := f.prov.Client(context.Background(), f.intern(t))
	if err != nil {
		return ""
	}
	res, err := c.Status(context.Background(), connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return ""
	}
	return res.Msg.GetModel()
}

// turn runs one turn through the gateway's REST door and returns the
// stream.
func (f *fleet) turn(t *testing.T, body string) string {
	t.Helper()
	status, out, _ := f.e.Do(t, "POST", "/interns/"+f.id+"/chat/completions", f.e.WorkspaceKey, "application/json", body)
	if status != 200 {
		t.Fatalf("chat: %d %s", status, out)
	}
	return out
}

var sessionRE = regexp.MustCompile(`"session_id":"([^"]+)"`)

func (f *fleet) asleep(t *testing.T) {
	t.Helper()
	if _, err := f.db.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternSleeping).Where("id = ?", f.id).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.prov.Changed(context.Background(), &store.Intern{ID: f.id})
	if f.h.Hosts() {
		testutil.Eventually(t, WaitLimit, "the daemon goes, the files stay", func() bool {
			running, _ := observed(f.prov.Backend, f.id)
			return !running && f.h.Kept(f.id)
		})
	}
}

// lifecycle is the suite's table: each step starts where the previous one
// left the fleet.
var lifecycle = []struct {
	name string
	run  func(t *testing.T, f *fleet)
}{
	{"create", func(t *testing.T, f *fleet) {
		f.h.Register(t, f.prov, f.id)
		testutil.Eventually(t, WaitLimit, "running", func() bool { return f.state(t) == store.InternRunning })
		if in := f.intern(t); in.Provisioner != f.prov.Backend.Name() || in.DaemonURL == "" {
			t.Fatalf("daemon record: %+v", in)
		}
	}},
	{"turn, sleep, wake with files and session intact", func(t *testing.T, f *fleet) {
		out := f.turn(t, `{"stream":true,"messages":[{"role":"user","content":"remember me"}]}`)
		m := sessionRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no session: %s", out)
		}
		f.asleep(t)
		out = f.turn(t, `{"stream":true,"session_id":"`+m[1]+`","messages":[{"role":"user","content":"back again"}]}`)
		if !strings.Contains(out, "back again") || !strings.Contains(out, `"session_id":"`+m[1]+`"`) || !strings.Contains(out, "[DONE]") {
			t.Fatalf("turn to a sleeping intern: %s", out)
		}
		if f.state(t) != store.InternRunning {
			t.Fatalf("after the wake: %s", f.state(t))
		}
	}},
	{"change the model", func(t *testing.T, f *fleet) {
		if !f.h.Hosts() {
			t.Skip("the operator's daemon runs the model it was started with")
		}
		// And back: the demo model answers offline.
		for _, model := range []string{"cohort/other", "cohort/demo"} {
			if _, err := f.e.Server.Interns.Update(context.Background(), f.e.Operator(), &cohortv1.UpdateInternRequest{Id: f.id, Model: &model}); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, WaitLimit, "the daemon runs the new model", func() bool { return f.model(t) == model })
		}
	}},
	{"suspend and resume", func(t *testing.T, f *fleet) {
		ctx := context.Background()
		if _, err := f.e.Server.Interns.Suspend(ctx, f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		if _, err := f.prov.Client(ctx, f.intern(t)); !apierr.Is(err, 409, apierr.ReasonInternNotReady) {
			t.Fatalf("suspended intern: %v", err)
		}
		if f.h.Hosts() {
			testutil.Eventually(t, WaitLimit, "the suspended intern's daemon goes", func() bool {
				running, _ := observed(f.prov.Backend, f.id)
				return !running
			})
		}
		if _, err := f.e.Server.Interns.Resume(ctx, f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, WaitLimit, "running again", func() bool { return f.state(t) == store.InternRunning && f.model(t) != "" })
	}},
	{"a crash of the daemon", func(t *testing.T, f *fleet) {
		before := f.intern(t).DaemonURL
		f.h.Crash(t, f.prov.Backend, f.id)
		if !f.h.Hosts() {
			// The gateway cannot start it: the intern is unreachable until
			// the operator runs and registers it again.
			status, body, _ := f.e.Do(t, "POST", "/interns/"+f.id+"/chat/completions", f.e.WorkspaceKey, "application/json",
				`{"stream":true,"messages":[{"role":"user","content":"anyone?"}]}`)
			if status != 502 || !strings.Contains(body, "intern_unreachable") {
				t.Fatalf("turn to a crashed remote daemon: %d %s", status, body)
			}
			f.h.Register(t, f.prov, f.id)
		}
		testutil.Eventually(t, WaitLimit, "a new daemon answers", func() bool {
			return f.intern(t).DaemonURL != before && f.model(t) != ""
		})
		out := f.turn(t, `{"stream":true,"messages":[{"role":"user","content":"after the crash"}]}`)
		if !strings.Contains(out, "after the crash") {
			t.Fatalf("turn after the crash: %s", out)
		}
	}},
	{"a gateway restart with adoption", func(t *testing.T, f *fleet) {
		before := f.intern(t)
		f.prov.Close()
		f.serve(newFleet(t, f.e, f.h.Backend(t)))
		out := f.turn(t, `{"stream":true,"messages":[{"role":"user","content":"after the restart"}]}`)
		if !strings.Contains(out, "after the restart") {
			t.Fatalf("turn after the restart: %s", out)
		}
		if !f.h.Outlives() {
			return
		}
		if after := f.intern(t); after.DaemonURL != before.DaemonURL || after.DaemonSecret != before.DaemonSecret {
			t.Fatalf("the daemon was replaced, not adopted: %s → %s", before.DaemonURL, after.DaemonURL)
		}
	}},
	{"two replicas racing to wake one intern", func(t *testing.T, f *fleet) {
		if !f.h.Replicas() {
			t.Skip("one machine's jails have one gateway")
		}
		f.asleep(t)
		other := newFleet(t, f.e, f.h.Backend(t))
		defer other.Close()
		in := f.intern(t)
		var wg sync.WaitGroup
		rows := make([]*store.Intern, 4)
		errs := make([]error, 4)
		for i := range rows {
			p := f.prov
			if i%2 == 1 {
				p = other
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rows[i], errs[i] = p.Wake(context.Background(), in)
			}()
		}
		wg.Wait()
		for i := range rows {
			if errs[i] != nil || rows[i].State != store.InternRunning || rows[i].DaemonURL != rows[0].DaemonURL {
				t.Fatalf("wake %d: %v %+v (first: %s)", i, errs[i], rows[i], rows[0].DaemonURL)
			}
		}
		out := f.turn(t, `{"stream":true,"messages":[{"role":"user","content":"one daemon"}]}`)
		if !strings.Contains(out, "one daemon") {
			t.Fatalf("turn after the race: %s", out)
		}
	}},
	{"delete", func(t *testing.T, f *fleet) {
		if _, err := f.e.Server.Interns.Delete(context.Background(), f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		if f.h.Hosts() {
			testutil.Eventually(t, WaitLimit, "the daemon and the files go", func() bool {
				_, present := observed(f.prov.Backend, f.id)
				return !present && !f.h.Kept(f.id)
			})
		}
	}},
}

// CohortBinary is the real cohort command, built once (binary).
func CohortBinary(t testing.TB) string {
	t.Helper()
	return binary(t, "cohort")
}

// InternBinary is cohort-intern, the small binary of an intern's jail,
// built once (binary): what a gateway's local interns run from, as
// it ships.
func InternBinary(t testing.TB) string {
	t.Helper()
	return binary(t, localjail.InternBinaryName)
}

// built holds the commands built so far (each once; a failure is kept).
var built struct {
	sync.Mutex
	paths map[string]string
	errs  map[string]error
}

// binary is where cmd/<cmd> is built, in the Go build cache: go run caches
// the executables it links, so a command is linked once per source, not
// once per test binary (each backend's package has its own), and nothing
// is left to clean up. A caller waits for a build under way.
func binary(t testing.TB, cmd string) string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if built.paths == nil {
		built.paths, built.errs = map[string]string{}, map[string]error{}
	}
	if _, ok := built.paths[cmd]; !ok {
		built.paths[cmd], built.errs[cmd] = build(cmd)
	}
	if err := built.errs[cmd]; err != nil {
		t.Fatal(err)
	}
	return built.paths[cmd]
}

// build has go run print the executable's path (-exec echo) instead of
// running it. Go run answers with its work directory's copy, gone when it
// exits, when it has just linked the command (and cached it): the second
// run answers with the cache's.
func build(cmd string) (string, error) {
	var path string
	for range 2 {
		out, err := exec.Command("go", "run", "-exec", "echo", "github.com/cohort-dev/cohort/cmd/"+cmd).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			return "", fmt.Errorf("go run -exec echo %s: %v\n%s", cmd, err, stderr)
		}
		path = strings.TrimSpace(string(out))
		if fi, err := os.Stat(path); err == nil && filepath.IsAbs(path) && fi.Mode().IsRegular() {
			return path, nil
		}
	}
	return "", fmt.Errorf("go run -exec echo %s: %q, not in the Go build cache (GOCACHE off?)", cmd, path)
}

// Daemon is an intern's daemon served from the test's own process on a
// loopback listener: as an operator runs one on another host, or as a test
// backend's host does.
type Daemon struct {
	URL string
	d   *internd.Daemon
	srv *httptest.Server
}

// ServeDaemon starts a daemon configured by c, creating its directory.
// The caller stops it.
func ServeDaemon(c internd.Config) (*Daemon, error) {
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, err
	}
	d, err := internd.New(c)
	if err != nil {
		return nil, err
	}
	srv := httptest.NewUnstartedServer(d.Handler())
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	return &Daemon{URL: srv.URL, d: d, srv: srv}, nil
}

// Stop ends the daemon and its connections, as a crash would.
func (d *Daemon) Stop() {
	d.srv.CloseClientConnections()
	d.srv.Close()
	d.d.Close()
}
