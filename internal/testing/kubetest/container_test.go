package kubetest

import (
	"os"
	"testing"
)

// TestHostPathNotRewritten: a host file under a Pod's mount path (a checkout
// in /tmp whose agents the test hands to a Pod) is not taken for a path in
// the Pod's volume; the mount path itself and paths that exist only in the
// Pod are.
func TestHostPathNotRewritten(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "kubetest-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if !hostPath(dir+"/", "/tmp") || !hostPath(dir+" --flag", "/tmp") {
		t.Errorf("%s exists on the host but was taken for the Pod's", dir)
	}
	if hostPath("/tmp", "/tmp") || hostPath("/tmp/", "/tmp") {
		t.Error("the mount path itself was taken for a host path")
	}
	if hostPath(dir+"/not-there", "/tmp") {
		t.Error("a path that exists only in the Pod was taken for a host path")
	}
}
