package jail_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
)

// The test binary, started with JAILTEST_PROGRAM=hostnames, reports what
// a program of the jail learns of the host from /proc, and whether /tmp
// takes a file.
func init() {
	if os.Getenv("JAILTEST_PROGRAM") != "hostnames" {
		return
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	cg, _ := os.ReadFile("/proc/self/cgroup")
	r := hostnamesReport{Mountinfo: string(mi), Cgroup: string(cg)}
	r.WriteTmp = errString(os.WriteFile("/tmp/x", []byte("x"), 0o644))
	r.WriteShm = errString(os.WriteFile("/dev/shm/x", []byte("x"), 0o644))
	r.WriteIntern = errString(os.WriteFile("/intern/x", []byte("x"), 0o644))
	json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

type hostnamesReport struct {
	Mountinfo   string `json:"mountinfo"`
	Cgroup      string `json:"cgroup"`
	WriteTmp    string `json:"write_tmp"`
	WriteShm    string `json:"write_shm"`
	WriteIntern string `json:"write_intern"`
}

// runHostnames runs the reporting program in a jail laid out as the local
// provisioner lays out an intern's: the binary bound from a host path at
// /run/cohort/bin/cohort, the intern's directory (named by its id) bound
// writable at /intern, the binary's directory hidden, and a cgroup.
func runHostnames(t *testing.T, userNS bool, hide []string, binDir, internDir string) hostnamesReport {
	t.Helper()
	bin := copySelf(t, binDir)
	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	j, err := jail.Start(jail.Spec{
		Argv: []string{"/run/cohort/bin/cohort", "-test.run=^$"}, Env: []string{"JAILTEST_PROGRAM=hostnames"},
		Binds: append(jail.SystemBinds(), jail.Bind{Src: bin, Dst: "/run/cohort/bin/cohort"},
			jail.Bind{Src: internDir, Dst: "/intern", Writable: true}),
		Hide: hide,
		UID:  2000000001, GID: 2000000001, UserNS: userNS,
		Limits: jail.Limits{Memory: 1 << 30, Pids: 100},
	}, jail.Options{Stdout: f, Stderr: f})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.Done():
	case <-time.After(30 * time.Second):
		j.Kill()
		t.Fatal("the jail did not finish")
	}
	j.Wait()
	b, _ := os.ReadFile(out)
	var r hostnamesReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("the program said %q: %v", b, err)
	}
	return r
}

// Neither /proc/self/mountinfo nor /proc/self/cgroup names a host path of
// the jail: not the binary's host directory, not the intern's id (its
// directory's name, and its overlay work directory's), not the gateway's
// own cgroup nor the jail's. The jail's cgroup
// is the root of a cgroup namespace of its own.
func TestNoHostNamesInProc(t *testing.T) {
	needNamespaces(t)
	own, _ := os.ReadFile("/proc/self/cgroup")
	for _, userNS := range []bool{false, true} {
		if !userNS && os.Geteuid() != 0 {
			continue
		}
		base := openDir(t)
		binDir := filepath.Join(base, "gatewaybin-7f3a")
		internDir := filepath.Join(base, "interns", "intern-5be1c0de")
		for _, d := range []string{binDir, internDir} {
			if err := os.MkdirAll(d, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(d, 0o777)
		}
		r := runHostnames(t, userNS, []string{binDir}, binDir, internDir)
		if r.WriteIntern != "" {
			t.Fatalf("userns=%v: /intern not writable: %s", userNS, r.WriteIntern)
		}
		// Not checked: the binary's own file name (the root of its
		// mount is the file, named as on the host; cmd/cohort's is
		// cohort or cohort-intern, which the jail knows anyway).
		if strings.Contains(r.Mountinfo, "/jail.test ") {
			t.Logf("userns=%v: the binary's file name still shows as its mount's root (known)", userNS)
		}
		names := []string{"gatewaybin-7f3a", "intern-5be1c0de", base, "cohort-jail-"}
		for _, l := range strings.Split(string(own), "\n") {
			if parts := strings.SplitN(l, ":", 3); len(parts) == 3 && parts[2] != "/" {
				names = append(names, parts[2])
			}
		}
		for _, n := range names {
			if strings.Contains(r.Mountinfo, n) {
				t.Errorf("userns=%v: /proc/self/mountinfo names %q:\n%s", userNS, n, r.Mountinfo)
			}
			if strings.Contains(r.Cgroup, n) {
				t.Errorf("userns=%v: /proc/self/cgroup names %q:\n%s", userNS, n, r.Cgroup)
			}
		}
		for _, l := range strings.Split(strings.TrimSpace(r.Cgroup), "\n") {
			if parts := strings.SplitN(l, ":", 3); len(parts) != 3 || parts[2] != "/" {
				t.Errorf("userns=%v: /proc/self/cgroup line %q: want every cgroup at / (a namespace rooted at the jail's)", userNS, l)
			}
		}
	}
}

// A gateway binary in /tmp (its directory is hidden from the jail) leaves
// the jail's own /tmp writable: the jail's /tmp is a private tmpfs, which
// shows nothing of the host's to hide.
func TestTmpWritableWhereverTheBinaryLives(t *testing.T) {
	needNamespaces(t)
	for _, userNS := range []bool{false, true} {
		if !userNS && os.Geteuid() != 0 {
			continue
		}
		base := openDir(t)
		internDir := filepath.Join(base, "intern")
		os.MkdirAll(internDir, 0o777)
		os.Chmod(internDir, 0o777)
		// The binary's directory as cmd/cohort hides it: /tmp itself, and
		// /dev/shm for one kept there.
		r := runHostnames(t, userNS, []string{"/tmp", "/dev/shm", base}, base, internDir)
		if r.WriteTmp != "" || r.WriteShm != "" {
			t.Errorf("userns=%v: the binary's directory hidden: /tmp %q, /dev/shm %q; want both writable", userNS, r.WriteTmp, r.WriteShm)
		}
	}
}
