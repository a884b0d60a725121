package jail_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/jail"
)

// A jail entering a prepared view (Spec.View, ADR 0985), as a gVisor
// sandbox's commands do: the view here is made by the test (as root, with
// read-only binds of the host's system directories), since the host's
// kernel is what runs the test. The program sees the view and nothing
// else, holds no capability and cannot get one back by exec, and has no
// way to the host's network or processes.
func TestJailView(t *testing.T) {
	needNamespaces(t)
	if os.Geteuid() != 0 {
		t.Skip("making the view takes root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	view := t.TempDir()
	mount := func(src, dst string, file bool) {
		if file {
			os.MkdirAll(filepath.Dir(dst), 0o755)
			os.WriteFile(dst, nil, 0o644)
		} else {
			os.MkdirAll(dst, 0o755)
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatalf("bind %s: %v", src, err)
		}
		t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("read-only %s: %v", dst, err)
		}
	}
	for _, p := range []string{"/usr", "/bin", "/lib", "/lib64"} {
		switch st, err := os.Lstat(p); {
		case err != nil:
		case st.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			os.Symlink(target, filepath.Join(view, p))
		default:
			mount(p, filepath.Join(view, p), false)
		}
	}
	mount(self, filepath.Join(view, "run/jailtest"), true)
	// The view's own directory is read-only too (a sandbox's is in its
	// read-only root), and its /tmp a writable tmpfs.
	os.Mkdir(filepath.Join(view, "tmp"), 0o755)
	mount(view, view, false)
	if err := unix.Mount("tmpfs", filepath.Join(view, "tmp"), "tmpfs", 0, "mode=1777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(view, "tmp"), unix.MNT_DETACH) })

	host := t.TempDir()
	secret := filepath.Join(host, "kek.json")
	os.WriteFile(secret, []byte("canary-kek"), 0o644)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, _ := os.CreateTemp(host, "out")
	errf, _ := os.CreateTemp(host, "err")
	j, err := jail.Start(jail.Spec{
		Argv: []string{"/run/jailtest", "-test.run=^$"}, Dir: "/tmp",
		Env: []string{"JAILTEST_PROGRAM=1", "JAILTEST_SECRET=" + secret, "JAILTEST_HOST_ADDR=" + ln.Addr().String(),
			"JAILTEST_CALLER_PID=" + strconv.Itoa(os.Getpid())},
		View: view, Inherit: true, UserNS: true, Hostname: "sandbox",
	}, jail.Options{Stdout: out, Stderr: errf})
	if err != nil {
		t.Fatal(err)
	}
	r := awaitReport(t, j, out, errf)
	if r.UID != 0 || r.CapGet != 0 || r.BoundSysAdmin {
		t.Errorf("uid %d, effective capabilities %#x, CAP_SYS_ADMIN bounded %v: want uid 0 of the jail with none and none to get back", r.UID, r.CapGet, r.BoundSysAdmin)
	}
	if r.Hostname != "sandbox" {
		t.Errorf("hostname %q", r.Hostname)
	}
	allowed := map[string]bool{"usr": true, "bin": true, "lib": true, "lib64": true, "run": true, "tmp": true}
	for _, name := range r.Root {
		if !allowed[name] {
			t.Errorf("/%s is in the view's root", name)
		}
	}
	if len(r.PIDs) != 0 {
		t.Errorf("the view shows pids %v: it has no /proc", r.PIDs)
	}
	for what, err := range map[string]string{"read the host's file": r.Secret, "dial the host's loopback": r.HostDial,
		"signal the caller": r.KillCaller, "write /usr": r.WriteUsr, "write /": r.WriteRoot} {
		if err == "" {
			t.Errorf("the program could %s", what)
		}
	}
	if r.WriteTmp != "" {
		t.Errorf("writing the view's /tmp failed: %s", r.WriteTmp)
	}
	if _, err := os.Stat(filepath.Join(view, "tmp", "out")); err != nil && r.WriteTmp == "" {
		t.Errorf("the view's /tmp was not written: %v", err)
	}
}

// A view with binds besides is refused: the init would not make them.
func TestJailViewWithBinds(t *testing.T) {
	needNamespaces(t)
	err := jail.Probe(jail.Spec{View: t.TempDir(), Inherit: true, UserNS: true, Binds: []jail.Bind{{Src: "/usr", Dst: "/usr"}}})
	if err == nil || !strings.Contains(err.Error(), "prepared view") {
		t.Fatalf("probe of a view with binds: %v", err)
	}
}
