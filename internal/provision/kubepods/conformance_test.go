package kubepods_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/kubepods"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/kubetest"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
)

// The Kubernetes backend passes the conformance suite against a real API
// server (internal/testing/kubetest) whose fake kubelet runs the interns' Pods as
// processes of this machine.
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	provisiontest.Run(t, newHost)
}

type host struct {
	kc      *kubetest.Cluster
	gateway string
}

const namespace = "cohort-interns"

func newHost(t *testing.T) provisiontest.Host {
	kc := kubetest.Start(t)
	kc.Namespace(t, namespace)
	// Log: the Pods' output and how their processes ended, shown when the test fails.
	node := &kubetest.Node{Client: kc.Client, Namespace: namespace, Dir: t.TempDir(),
		Binaries: map[string]string{"/cohort": provisiontest.CohortBinary(t)}, Log: t.Logf}
	node.Start(t)
	return &host{kc: kc}
}

func (h *host) Backend(t *testing.T) provision.Backend {
	return &kubepods.Backend{Config: kubepods.Config{REST: h.kc.Config, Namespace: namespace, Image: "ghcr.io/cohort-dev/cohort:test",
		GatewayURL: h.gateway + server.Prefix, RelayURL: h.gateway + kubepods.RelayPath, WakeTimeout: provisiontest.WaitLimit, LeaseDuration: 5 * time.Second}}
}
func (h *host) GatewayAt(url string)                              { h.gateway = url }
func (*host) Hosts() bool                                         { return true }
func (*host) Outlives() bool                                      { return true }
func (*host) Replicas() bool                                      { return true }
func (*host) Register(*testing.T, *provision.Provisioner, string) {}
func (*host) Done(provision.Backend)                              {}

// Kept: the intern's claim is there.
func (h *host) Kept(id string) bool {
	_, err := h.kc.Client.CoreV1().PersistentVolumeClaims(namespace).Get(context.Background(), "intern-"+id, metav1.GetOptions{})
	return err == nil
}

// Crash kills the Pod's daemon process: its Pod ends (Failed).
func (*host) Crash(t *testing.T, _ provision.Backend, id string) {
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
