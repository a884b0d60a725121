package localjail_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
)

// The local backend passes the conformance suite with its interns jailed
// and, as with --unsafe-shared-host, as children of the gateway.
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	for name, jailed := range map[string]bool{"jailed": true, "shared": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			provisiontest.Run(t, func(t *testing.T) provisiontest.Host { return newHost(t, jailed) })
		})
	}
}

// host is this machine, its interns jailed (their jails outlive their
// gateway for a minute, so that the next one adopts them) or children of
// the gateway.
type host struct {
	dataDir, bin string
	jail         *localjail.JailConfig
}

func newHost(t *testing.T, jailed bool) provisiontest.Host {
	dir := t.TempDir()
	h := &host{dataDir: dir, bin: provisiontest.InternBinary(t)}
	if !jailed {
		return h
	}
	relay, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	h.jail = &localjail.JailConfig{Relay: relay, Hide: localjail.HiddenPaths(dir), Orphan: time.Minute}
	if err := h.Backend(t).(*localjail.Backend).ProbeJail(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("SKIPPING: %v", err)
	}
	return h
}

func (h *host) Backend(*testing.T) provision.Backend {
	return &localjail.Backend{DataDir: h.dataDir, Command: []string{h.bin}, Jail: h.jail}
}

func (h *host) Kept(id string) bool {
	_, err := os.Stat(filepath.Join(h.dataDir, "interns", id, "sessions"))
	return err == nil
}

func (*host) GatewayAt(string)                                    {}
func (*host) Hosts() bool                                         { return true }
func (*host) Replicas() bool                                      { return false }
func (h *host) Outlives() bool                                    { return h.jail != nil }
func (*host) Register(*testing.T, *provision.Provisioner, string) {}

func (*host) Crash(t *testing.T, b provision.Backend, id string) {
	pid := b.(*localjail.Backend).DaemonPID(id)
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("no daemon process (%d)", pid)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// Done: the last gateway stops its jails with it.
func (h *host) Done(provision.Backend) {
	if h.jail != nil {
		h.jail.Orphan = 0
	}
}
