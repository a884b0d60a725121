package provision_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/kubetest"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/kubepods"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/storetest"
	"github.com/cohort-dev/cohort/internal/testenv"
	"github.com/cohort-dev/cohort/internal/testutil"
)

// The backend conformance suite: one table of lifecycle steps, run in
// order against every backend by the same reconciler. A backend is a host
// (what outlives one gateway: a machine's jails, a cluster, an operator's
// daemons) and the backends each gateway opens on it.

// host is one backend kind under the suite.
type host interface {
	// backend is one gateway's backend on this host: a restarted gateway
	// or a second replica opens another.
	backend(t *testing.T) provision.Backend
	// hosts: the backend starts daemons itself (remote's are the
	// operator's: the suite registers them).
	hosts() bool
	// replicas: gateways on two machines may share it (local jails are
	// one machine's, one gateway's).
	replicas() bool
	// outlives: its daemons outlive their gateway, for the next to adopt
	// (unjailed children die with theirs).
	outlives() bool
	// register has the operator run and register the intern's daemon
	// (remote only).
	register(t *testing.T, p *provision.Provisioner, id string)
	// crash ends the intern's daemon behind the gateway's back.
	crash(t *testing.T, b provision.Backend, id string)
	// gatewayAt says where the gateway under test listens.
	gatewayAt(url string)
	// kept reports whether the intern's files are on the host.
	kept(id string) bool
	// done lets the host's daemons go at the end of the test.
	done(b provision.Backend)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// suiteFleet is the gateway under test and its fleet.
type suiteFleet struct {
	h    host
	e    *testenv.Env
	db   *bun.DB
	prov *provision.Provisioner
	id   string
}

func newSuiteFleet(t *testing.T, e *testenv.Env, b provision.Backend) *provision.Provisioner {
	t.Helper()
	p := &provision.Provisioner{DB: e.DB, KEK: e.Server.KEK, Log: e.Server.Log, Backend: b,
		RestartBackoff: 100 * time.Millisecond, Sweep: 100 * time.Millisecond}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// serve makes p the gateway's fleet (its API hook and chat's dialer).
func (f *suiteFleet) serve(p *provision.Provisioner) {
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

func (f *suiteFleet) state(t *testing.T) string { return loadIntern(t, f.db, f.id).State }

func (f *suiteFleet) model(t *testing.T) string {
	st, err := status(t, f.prov, loadIntern(t, f.db, f.id))
	if err != nil {
		return ""
	}
	return st.GetModel()
}

func (f *suiteFleet) asleep(t *testing.T) {
	t.Helper()
	if _, err := f.db.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternSleeping).Where("id = ?", f.id).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.prov.Changed(context.Background(), &store.Intern{ID: f.id})
	if f.h.hosts() {
		testutil.Eventually(t, waitLimit, "the daemon goes, the files stay", func() bool {
			running, _ := observed(f.prov.Backend, f.id)
			return !running && f.h.kept(f.id)
		})
	}
}

// lifecycle is the suite's table: each step starts where the previous one
// left the fleet.
var lifecycle = []struct {
	name string
	run  func(t *testing.T, f *suiteFleet)
}{
	{"create", func(t *testing.T, f *suiteFleet) {
		f.h.register(t, f.prov, f.id)
		testutil.Eventually(t, waitLimit, "running", func() bool { return f.state(t) == store.InternRunning })
		if in := loadIntern(t, f.db, f.id); in.Provisioner != f.prov.Backend.Name() || in.DaemonURL == "" {
			t.Fatalf("daemon record: %+v", in)
		}
	}},
	{"turn, sleep, wake with files and session intact", func(t *testing.T, f *suiteFleet) {
		out := chatTurn(t, f.e, f.id, `{"stream":true,"messages":[{"role":"user","content":"remember me"}]}`)
		m := sessionRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no session: %s", out)
		}
		f.asleep(t)
		out = chatTurn(t, f.e, f.id, `{"stream":true,"session_id":"`+m[1]+`","messages":[{"role":"user","content":"back again"}]}`)
		if !strings.Contains(out, "back again") || !strings.Contains(out, `"session_id":"`+m[1]+`"`) || !strings.Contains(out, "[DONE]") {
			t.Fatalf("turn to a sleeping intern: %s", out)
		}
		if f.state(t) != store.InternRunning {
			t.Fatalf("after the wake: %s", f.state(t))
		}
	}},
	{"change the model", func(t *testing.T, f *suiteFleet) {
		if !f.h.hosts() {
			t.Skip("the operator's daemon runs the model it was started with")
		}
		// And back: the demo model answers offline.
		for _, model := range []string{"cohort/other", "cohort/demo"} {
			if _, err := f.e.Server.Interns.Update(context.Background(), f.e.Operator(), &cohortv1.UpdateInternRequest{Id: f.id, Model: &model}); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, waitLimit, "the daemon runs the new model", func() bool { return f.model(t) == model })
		}
	}},
	{"suspend and resume", func(t *testing.T, f *suiteFleet) {
		ctx := context.Background()
		if _, err := f.e.Server.Interns.Suspend(ctx, f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		if _, err := f.prov.Client(ctx, loadIntern(t, f.db, f.id)); !apierr.Is(err, 409, "intern_not_ready") {
			t.Fatalf("suspended intern: %v", err)
		}
		if f.h.hosts() {
			testutil.Eventually(t, waitLimit, "the suspended intern's daemon goes", func() bool {
				running, _ := observed(f.prov.Backend, f.id)
				return !running
			})
		}
		if _, err := f.e.Server.Interns.Resume(ctx, f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, waitLimit, "running again", func() bool { return f.state(t) == store.InternRunning && f.model(t) != "" })
	}},
	{"a crash of the daemon", func(t *testing.T, f *suiteFleet) {
		before := loadIntern(t, f.db, f.id).DaemonURL
		f.h.crash(t, f.prov.Backend, f.id)
		if !f.h.hosts() {
			// The gateway cannot start it: the intern is unreachable until
			// the operator runs and registers it again.
			status, body, _ := f.e.Do(t, "POST", "/interns/"+f.id+"/chat/completions", f.e.WorkspaceKey, "application/json",
				`{"stream":true,"messages":[{"role":"user","content":"anyone?"}]}`)
			if status != 502 || !strings.Contains(body, "intern_unreachable") {
				t.Fatalf("turn to a crashed remote daemon: %d %s", status, body)
			}
			f.h.register(t, f.prov, f.id)
		}
		testutil.Eventually(t, waitLimit, "a new daemon answers", func() bool {
			return loadIntern(t, f.db, f.id).DaemonURL != before && f.model(t) != ""
		})
		out := chatTurn(t, f.e, f.id, `{"stream":true,"messages":[{"role":"user","content":"after the crash"}]}`)
		if !strings.Contains(out, "after the crash") {
			t.Fatalf("turn after the crash: %s", out)
		}
	}},
	{"a gateway restart with adoption", func(t *testing.T, f *suiteFleet) {
		before := loadIntern(t, f.db, f.id)
		f.prov.Close()
		f.serve(newSuiteFleet(t, f.e, f.h.backend(t)))
		out := chatTurn(t, f.e, f.id, `{"stream":true,"messages":[{"role":"user","content":"after the restart"}]}`)
		if !strings.Contains(out, "after the restart") {
			t.Fatalf("turn after the restart: %s", out)
		}
		if !f.h.outlives() {
			return
		}
		if after := loadIntern(t, f.db, f.id); after.DaemonURL != before.DaemonURL || after.DaemonSecret != before.DaemonSecret {
			t.Fatalf("the daemon was replaced, not adopted: %s → %s", before.DaemonURL, after.DaemonURL)
		}
	}},
	{"two replicas racing to wake one intern", func(t *testing.T, f *suiteFleet) {
		if !f.h.replicas() {
			t.Skip("one machine's jails have one gateway")
		}
		f.asleep(t)
		other := newSuiteFleet(t, f.e, f.h.backend(t))
		defer other.Close()
		in := loadIntern(t, f.db, f.id)
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
		out := chatTurn(t, f.e, f.id, `{"stream":true,"messages":[{"role":"user","content":"one daemon"}]}`)
		if !strings.Contains(out, "one daemon") {
			t.Fatalf("turn after the race: %s", out)
		}
	}},
	{"delete", func(t *testing.T, f *suiteFleet) {
		if _, err := f.e.Server.Interns.Delete(context.Background(), f.e.Operator(), f.id); err != nil {
			t.Fatal(err)
		}
		if f.h.hosts() {
			testutil.Eventually(t, waitLimit, "the daemon and the files go", func() bool {
				_, present := observed(f.prov.Backend, f.id)
				return !present && !f.h.kept(f.id)
			})
		}
	}},
}

// hosts are every backend: the three of the gateway and a fake fourth,
// defined in this file alone, that proves a backend needs nothing outside
// its package but the line that names it.
func suiteHosts(t *testing.T) map[string]func(t *testing.T) host {
	return map[string]func(t *testing.T) host{
		"localjail":   func(t *testing.T) host { return newLocalHost(t, true) },
		"localshared": func(t *testing.T) host { return newLocalHost(t, false) },
		"remote":      func(t *testing.T) host { return newInprocHost(t, true) },
		"fake":        func(t *testing.T) host { return newInprocHost(t, false) },
		"kubepods":    newKubeHost,
	}
}

func TestBackendConformance(t *testing.T) {
	t.Parallel()
	for name, mk := range suiteHosts(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := mk(t)
			db := storetest.SQLite(t)
			f := &suiteFleet{h: h, db: db}
			f.e = testenv.New(t, db, func(s *server.Server) {})
			f.id = f.e.InternID
			h.gatewayAt(f.e.URL)
			f.serve(newSuiteFleet(t, f.e, h.backend(t)))
			t.Cleanup(func() {
				h.done(f.prov.Backend)
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
		})
	}
}

// localHost is this machine, its interns jailed (their jails outlive
// their gateway for a minute, so that the next one adopts them) or, as
// with --unsafe-shared-host, children of the gateway.
type localHost struct {
	dataDir, bin string
	jail         *localjail.JailConfig
}

func newLocalHost(t *testing.T, jailed bool) host {
	dir := t.TempDir()
	h := &localHost{dataDir: dir, bin: internBinary(t)}
	if !jailed {
		return h
	}
	relay, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	h.jail = &localjail.JailConfig{Relay: relay, Hide: localjail.HiddenPaths(dir), Orphan: time.Minute}
	if err := h.backend(t).(*localjail.Backend).ProbeJail(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("SKIPPING: %v", err)
	}
	return h
}

func (h *localHost) backend(*testing.T) provision.Backend {
	return &localjail.Backend{DataDir: h.dataDir, Command: []string{h.bin}, Jail: h.jail}
}
func (h *localHost) kept(id string) bool {
	return exists(filepath.Join(h.dataDir, "interns", id, "sessions"))
}
func (*localHost) gatewayAt(string)                                    {}
func (*localHost) hosts() bool                                         { return true }
func (*localHost) replicas() bool                                      { return false }
func (h *localHost) outlives() bool                                    { return h.jail != nil }
func (*localHost) register(*testing.T, *provision.Provisioner, string) {}
func (*localHost) crash(t *testing.T, b provision.Backend, id string) {
	pid := b.(*localjail.Backend).DaemonPID(id)
	if !alive(pid) {
		t.Fatalf("no daemon process (%d)", pid)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// done: the last gateway stops its jails with it.
func (h *localHost) done(provision.Backend) {
	if h.jail != nil {
		h.jail.Orphan = 0
	}
}

// inprocHost runs daemons in the test's own process, each on a loopback
// listener with its directory under dir: for the remote backend, as the
// operator would run them on other hosts; for the fake backend, as that
// backend's host.
type inprocHost struct {
	t      *testing.T
	remote bool
	dir    string
	bin    string

	mu      sync.Mutex
	daemons map[string]*inprocDaemon
	claims  map[string]bool
	changed []func()
}

type inprocDaemon struct {
	id, runs, url, secret string
	since                 time.Time
	d                     *internd.Daemon
	srv                   *httptest.Server
}

func newInprocHost(t *testing.T, remote bool) host {
	h := &inprocHost{t: t, remote: remote, dir: t.TempDir(), bin: internBinary(t), daemons: map[string]*inprocDaemon{}, claims: map[string]bool{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range h.daemons {
			d.stop()
		}
	})
	return h
}

// start runs a daemon for the intern with secret and model.
func (h *inprocHost) start(id, model, runs, secret string) (*inprocDaemon, error) {
	dir := filepath.Join(h.dir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d, err := internd.New(internd.Config{InternID: id, Secret: secret, DataDir: dir, Model: model, AgentCommand: []string{h.bin, "agent"}})
	if err != nil {
		return nil, err
	}
	srv := httptest.NewUnstartedServer(d.Handler())
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	return &inprocDaemon{id: id, runs: runs, url: srv.URL, secret: secret, since: time.Now(), d: d, srv: srv}, nil
}

func (d *inprocDaemon) stop() {
	d.srv.CloseClientConnections()
	d.srv.Close()
	d.d.Close()
}

func (h *inprocHost) backend(*testing.T) provision.Backend {
	if h.remote {
		return &remote.Backend{}
	}
	return &fakeBackend{h: h}
}
func (h *inprocHost) hosts() bool         { return !h.remote }
func (h *inprocHost) kept(id string) bool { return exists(filepath.Join(h.dir, id, "sessions")) }
func (*inprocHost) replicas() bool        { return true }
func (*inprocHost) outlives() bool        { return true }

// register runs the intern's daemon as an operator would and registers it.
func (h *inprocHost) register(t *testing.T, p *provision.Provisioner, id string) {
	if !h.remote {
		return
	}
	secret := provision.NewSecret()
	d, err := h.start(id, "cohort/demo", "", secret)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.daemons[id] = d
	h.mu.Unlock()
	if _, err := remote.Register(context.Background(), p, id, d.url, secret); err != nil {
		t.Fatal(err)
	}
}

func (h *inprocHost) crash(t *testing.T, _ provision.Backend, id string) {
	h.mu.Lock()
	d := h.daemons[id]
	delete(h.daemons, id)
	changed := h.changed
	h.mu.Unlock()
	if d == nil {
		t.Fatal("no daemon to crash")
	}
	d.stop()
	for _, c := range changed {
		c()
	}
}

func (*inprocHost) done(provision.Backend) {}
func (*inprocHost) gatewayAt(string)       {}

// fakeBackend is a fourth backend, whole in this file: daemons in this
// process, their files in a directory, a claim per intern across the
// replicas sharing the host.
type fakeBackend struct {
	h     *inprocHost
	check func(ctx context.Context, url, secret string) error
}

func (*fakeBackend) Name() string { return "fake" }

func (b *fakeBackend) Open(ctx context.Context, h provision.Host) error {
	b.check = h.Check
	b.h.mu.Lock()
	b.h.changed = append(b.h.changed, h.Changed)
	b.h.mu.Unlock()
	return nil
}

func (b *fakeBackend) Observe() ([]provision.Observed, bool) {
	h := b.h
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []provision.Observed
	for _, d := range h.daemons {
		out = append(out, provision.Observed{ID: d.id, Running: true, Ready: true, URL: d.url, Runs: d.runs, Since: d.since})
	}
	ents, _ := os.ReadDir(h.dir)
	for _, e := range ents {
		if h.daemons[e.Name()] == nil {
			out = append(out, provision.Observed{ID: e.Name()})
		}
	}
	return out, true
}

func (*fakeBackend) Fingerprint(s provision.Spec) string {
	return fmt.Sprintf("%s/%s/%+v", s.Model, s.Agent, s.Limits)
}

func (b *fakeBackend) Claim(ctx context.Context, id string) (func(), error) {
	h := b.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.claims[id] {
		return nil, provision.ErrBusy
	}
	h.claims[id] = true
	return func() {
		h.mu.Lock()
		delete(h.claims, id)
		h.mu.Unlock()
	}, nil
}

func (b *fakeBackend) Ensure(ctx context.Context, spec provision.Spec) (provision.Daemon, error) {
	h := b.h
	runs := b.Fingerprint(spec)
	h.mu.Lock()
	d := h.daemons[spec.ID]
	h.mu.Unlock()
	if d != nil && d.runs == runs && spec.Secret != "" && d.secret == spec.Secret {
		return provision.Daemon{URL: d.url, Secret: d.secret, Log: []any{"kept", true}}, nil
	}
	if d != nil {
		b.Sleep(ctx, spec.ID)
	}
	secret, _, err := spec.Mint(ctx)
	if err != nil {
		return provision.Daemon{}, err
	}
	if d, err = h.start(spec.ID, spec.Model, runs, secret); err != nil {
		return provision.Daemon{}, err
	}
	h.mu.Lock()
	h.daemons[spec.ID] = d
	h.mu.Unlock()
	return provision.Daemon{URL: d.url, Secret: secret}, nil
}

func (b *fakeBackend) Sleep(ctx context.Context, id string) error {
	h := b.h
	h.mu.Lock()
	d := h.daemons[id]
	delete(h.daemons, id)
	h.mu.Unlock()
	if d != nil {
		d.stop()
	}
	return nil
}

func (b *fakeBackend) Remove(ctx context.Context, id string) error {
	b.Sleep(ctx, id)
	return os.RemoveAll(filepath.Join(b.h.dir, id))
}

// Close leaves the daemons to the host, as Pods outlive their gateway.
func (*fakeBackend) Close() {}

// kubeHost is a real API server (internal/kubetest) whose fake kubelet
// runs the interns' Pods as processes of this machine.
type kubeHost struct {
	kc      *kubetest.Cluster
	node    *kubetest.Node
	gateway string
}

const suiteKubeNS = "cohort-interns"

func newKubeHost(t *testing.T) host {
	kc := kubetest.Start(t)
	kc.Namespace(t, suiteKubeNS)
	// Log: the Pods' output and how their processes ended, shown when the test fails.
	node := &kubetest.Node{Client: kc.Client, Namespace: suiteKubeNS, Dir: t.TempDir(),
		Binaries: map[string]string{"/cohort": cohortBinary(t)}, Log: t.Logf}
	node.Start(t)
	return &kubeHost{kc: kc, node: node}
}

func (h *kubeHost) backend(t *testing.T) provision.Backend {
	return &kubepods.Backend{Config: kubepods.Config{REST: h.kc.Config, Namespace: suiteKubeNS, Image: "ghcr.io/cohort-dev/cohort:test",
		GatewayURL: h.gateway + server.Prefix, RelayURL: h.gateway + kubepods.RelayPath, WakeTimeout: waitLimit, LeaseDuration: 5 * time.Second}}
}
func (h *kubeHost) gatewayAt(url string)                              { h.gateway = url }
func (*kubeHost) hosts() bool                                         { return true }
func (*kubeHost) outlives() bool                                      { return true }
func (*kubeHost) replicas() bool                                      { return true }
func (*kubeHost) register(*testing.T, *provision.Provisioner, string) {}
func (*kubeHost) done(provision.Backend)                              {}

// kept: the intern's claim is there.
func (h *kubeHost) kept(id string) bool {
	_, err := h.kc.Client.CoreV1().PersistentVolumeClaims(suiteKubeNS).Get(context.Background(), "intern-"+id, metav1.GetOptions{})
	return err == nil
}

// crash kills the Pod's daemon process: its Pod ends (Failed).
func (*kubeHost) crash(t *testing.T, _ provision.Backend, id string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "\x00intern\x00") || !strings.Contains(string(b), "--intern-id\x00"+id+"\x00") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		syscall.Kill(pid, syscall.SIGKILL)
		return
	}
	t.Fatal("no daemon process of the intern's Pod")
}
