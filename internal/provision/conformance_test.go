package provision_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
)

// A fourth backend, whole in this file, passes the conformance suite: a
// backend needs nothing outside its own package (each of the gateway's
// runs the suite from its package's tests).
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	provisiontest.Run(t, newFakeHost)
}

// fakeHost runs daemons in the test's own process, each on a loopback
// listener with its directory under dir, a claim per intern across the
// replicas sharing the host.
type fakeHost struct {
	dir, bin string

	mu      sync.Mutex
	daemons map[string]*fakeDaemon
	claims  map[string]bool
	changed []func()
}

type fakeDaemon struct {
	*provisiontest.Daemon
	id, runs, secret string
	since            time.Time
}

func newFakeHost(t *testing.T) provisiontest.Host {
	h := &fakeHost{dir: t.TempDir(), bin: provisiontest.InternBinary(t), daemons: map[string]*fakeDaemon{}, claims: map[string]bool{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range h.daemons {
			d.Stop()
		}
	})
	return h
}

// start runs a daemon for the intern with secret and model.
func (h *fakeHost) start(id, model, runs, secret string) (*fakeDaemon, error) {
	d, err := provisiontest.ServeDaemon(internd.Config{InternID: id, Secret: secret, DataDir: filepath.Join(h.dir, id),
		Model: model, AgentCommand: []string{h.bin, "agent"}})
	if err != nil {
		return nil, err
	}
	return &fakeDaemon{Daemon: d, id: id, runs: runs, secret: secret, since: time.Now()}, nil
}

func (h *fakeHost) Backend(*testing.T) provision.Backend              { return &fakeBackend{h: h} }
func (*fakeHost) Hosts() bool                                         { return true }
func (*fakeHost) Replicas() bool                                      { return true }
func (*fakeHost) Outlives() bool                                      { return true }
func (*fakeHost) Register(*testing.T, *provision.Provisioner, string) {}
func (*fakeHost) Done(provision.Backend)                              {}
func (*fakeHost) GatewayAt(string)                                    {}

func (h *fakeHost) Kept(id string) bool {
	_, err := os.Stat(filepath.Join(h.dir, id, "sessions"))
	return err == nil
}

func (h *fakeHost) Crash(t *testing.T, _ provision.Backend, id string) {
	h.mu.Lock()
	d := h.daemons[id]
	delete(h.daemons, id)
	changed := h.changed
	h.mu.Unlock()
	if d == nil {
		t.Fatal("no daemon to crash")
	}
	d.Stop()
	for _, c := range changed {
		c()
	}
}

// fakeBackend is one gateway's backend on a fakeHost.
type fakeBackend struct {
	h     *fakeHost
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
		out = append(out, provision.Observed{ID: d.id, Running: true, Ready: true, URL: d.URL, Runs: d.runs, Since: d.since})
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
		return provision.Daemon{URL: d.URL, Secret: d.secret, Log: []any{"kept", true}}, nil
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
	return provision.Daemon{URL: d.URL, Secret: secret}, nil
}

func (b *fakeBackend) Sleep(ctx context.Context, id string) error {
	h := b.h
	h.mu.Lock()
	d := h.daemons[id]
	delete(h.daemons, id)
	h.mu.Unlock()
	if d != nil {
		d.Stop()
	}
	return nil
}

func (b *fakeBackend) Remove(ctx context.Context, id string) error {
	b.Sleep(ctx, id)
	return os.RemoveAll(filepath.Join(b.h.dir, id))
}

// Close leaves the daemons to the host, as Pods outlive their gateway.
func (*fakeBackend) Close() {}
