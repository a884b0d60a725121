package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/gvisor"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/testing/gvisortest"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
)

// The gvisor backend passes the conformance suite every backend runs.
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	provisiontest.Run(t, func(t *testing.T) provisiontest.Host { return newHost(t) })
}

// host is this machine, its interns in gVisor sandboxes that end with
// their gateway (ADR 0981).
type host struct {
	dataDir, bin string
	runsc        string
	jail         *localjail.JailConfig
}

func newHost(t *testing.T) provisiontest.Host {
	runsc := gvisortest.Runsc(t)
	dir := t.TempDir()
	h := &host{dataDir: dir, bin: provisiontest.InternBinary(t), runsc: runsc}
	relay, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	h.jail = &localjail.JailConfig{Relay: relay, Hide: localjail.HiddenPaths(dir)}
	if err := h.Backend(t).(*gvisor.Backend).Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *host) Backend(*testing.T) provision.Backend {
	return &gvisor.Backend{Jail: &localjail.Backend{DataDir: h.dataDir, Command: []string{h.bin}, Jail: h.jail}, Runsc: h.runsc}
}

func (h *host) Kept(id string) bool {
	_, err := os.Stat(filepath.Join(h.dataDir, "interns", id, "sessions"))
	return err == nil
}

func (*host) GatewayAt(string)                                    {}
func (*host) Hosts() bool                                         { return true }
func (*host) Replicas() bool                                      { return false }
func (*host) Outlives() bool                                      { return false }
func (*host) Register(*testing.T, *provision.Provisioner, string) {}
func (*host) Done(provision.Backend)                              {}

func (*host) Crash(t *testing.T, b provision.Backend, id string) {
	pid := b.(*gvisor.Backend).DaemonPID(id)
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("no sandbox process (%d)", pid)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

// A sandbox starts as every intern's does (the probe of Prepare).
func TestProbe(t *testing.T) {
	newHost(t)
}
