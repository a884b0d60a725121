//go:build linux

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A gateway that cannot jail its interns refuses to start before it writes
// anything: no database, no KEK, no bootstrap keys in its data directory.
func TestServeRefusesBeforeWriting(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(os.Args[0], "serve", "--listen", "127.0.0.1:0", "--data-dir", dir)
	cmd.Env = append(cleanAdminEnv(), forbidNamespacesEnv+"=1")
	// Root in a user namespace of its own, mapped to this user (and, for
	// root, the ids the jail's users take): the same files, and namespace
	// limits it may set for itself alone.
	uid, gid, n := os.Getuid(), os.Getgid(), 1
	if uid == 0 {
		n = 1<<32 - 1 // every id, as outside
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: n}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: n}}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 || err != nil && !errors.As(err, &exit) {
		t.Skipf("no user namespace with limits of its own here: %v %s", err, out)
	}
	if err == nil {
		t.Fatalf("serve started on a machine that cannot make jails:\n%s", out)
	}
	if !strings.Contains(string(out), "cannot jail interns") || !strings.Contains(string(out), "--unsafe-shared-host") {
		t.Errorf("the refusal does not say why and what to do:\n%s", out)
	}
	t.Logf("serve refused:\n%s", out)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("serve refused to start but left %s in its data directory", e.Name())
	}
}
