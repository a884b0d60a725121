package remote_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
)

// The remote backend passes the conformance suite, the test playing the
// operator who runs and registers each daemon.
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	provisiontest.Run(t, newHost)
}

// host is the operator's other hosts: daemons in the test's process, each
// with its directory under dir.
type host struct {
	dir, bin string

	mu      sync.Mutex
	daemons map[string]*provisiontest.Daemon
}

func newHost(t *testing.T) provisiontest.Host {
	h := &host{dir: t.TempDir(), bin: provisiontest.InternBinary(t), daemons: map[string]*provisiontest.Daemon{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range h.daemons {
			d.Stop()
		}
	})
	return h
}

func (*host) Backend(*testing.T) provision.Backend { return &remote.Backend{} }
func (*host) Hosts() bool                          { return false }
func (*host) Replicas() bool                       { return true }
func (*host) Outlives() bool                       { return true }
func (*host) Done(provision.Backend)               {}
func (*host) GatewayAt(string)                     {}

func (h *host) Kept(id string) bool {
	_, err := os.Stat(filepath.Join(h.dir, id, "sessions"))
	return err == nil
}

// Register runs the intern's daemon as an operator would and registers it.
func (h *host) Register(t *testing.T, p *provision.Provisioner, id string) {
	secret := provision.NewSecret()
	d, err := provisiontest.ServeDaemon(internd.Config{InternID: id, Secret: secret, DataDir: filepath.Join(h.dir, id),
		Model: "cohort/demo", AgentCommand: []string{h.bin, "agent"}})
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.daemons[id] = d
	h.mu.Unlock()
	if _, err := remote.Register(context.Background(), p, id, d.URL, secret); err != nil {
		t.Fatal(err)
	}
}

func (h *host) Crash(t *testing.T, _ provision.Backend, id string) {
	h.mu.Lock()
	d := h.daemons[id]
	delete(h.daemons, id)
	h.mu.Unlock()
	if d == nil {
		t.Fatal("no daemon to crash")
	}
	d.Stop()
}
