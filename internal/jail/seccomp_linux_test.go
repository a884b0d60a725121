package jail_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/jail"
)

// The test binary is also the program that tries the syscalls, inside a
// jail or under StartFiltered.
func init() {
	if os.Getenv("JAILTEST_SECCOMP") == "1" {
		json.NewEncoder(os.Stdout).Encode(trySyscalls())
		os.Exit(0)
	}
}

// trySyscalls calls each syscall in a way that succeeds (or fails with
// another errno than EPERM) when nothing filters it, and reports the errno
// of each ("" for success).
func trySyscalls() map[string]string {
	res := map[string]string{}
	note := func(name string, err error) {
		if err == nil {
			res[name] = ""
			return
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			res[name] = unix.ErrnoName(errno)
			return
		}
		res[name] = err.Error()
	}
	raw := func(name string, nr uintptr, a ...uintptr) {
		a = append(a, 0, 0, 0, 0, 0, 0)
		_, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		if e != 0 {
			note(name, e)
		} else {
			note(name, nil)
		}
	}
	// A child to trace: same uid, dumpable, a descendant.
	child := exec.Command("/bin/sleep", "30")
	if err := child.Start(); err == nil {
		err := unix.PtraceAttach(child.Process.Pid)
		note("ptrace", err)
		if err == nil {
			unix.PtraceDetach(child.Process.Pid)
		}
		child.Process.Kill()
		child.Wait()
	} else {
		res["ptrace"] = "start sleep: " + err.Error()
	}
	// A new user namespace, in a child (a threaded process cannot unshare it).
	note("unshare-user", exec.Command("/bin/true").Run()) // baseline: fork+exec works
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	note("clone-newuser", cmd.Run())
	cmd = exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWUSER}
	note("unshare-newuser", cmd.Run())
	cmd = exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	note("unshare-newns", cmd.Run())
	note("unshare-none", unix.Unshare(0))
	var v int
	buf := make([]byte, 8)
	local := []unix.Iovec{{Base: &buf[0], Len: 8}}
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&v)), Len: 8}}
	_, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
	note("process_vm_readv", err)
	_, err = unix.ProcessVMWritev(os.Getpid(), local, remote, 0)
	note("process_vm_writev", err)
	if pidfd, err := unix.PidfdOpen(os.Getpid(), 0); err == nil {
		fd, err := unix.PidfdGetfd(pidfd, 0, 0)
		note("pidfd_getfd", err)
		unix.Close(fd)
		unix.Close(pidfd)
	}
	raw("kcmp", unix.SYS_KCMP, uintptr(os.Getpid()), uintptr(os.Getpid()), 0 /* KCMP_FILE */, 0, 0)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_PROCESS_KEYRING, true)
	note("keyctl", err)
	_, err = unix.AddKey("user", "cohort-seccomp-test", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	note("add_key", err)
	_, err = unix.RequestKey("user", "cohort-seccomp-none", "", unix.KEY_SPEC_PROCESS_KEYRING)
	note("request_key", err) // ENOKEY when allowed
	// io_uring_setup with no params: EFAULT when allowed.
	raw("io_uring_setup", unix.SYS_IO_URING_SETUP, 1, 0)
	// userfaultfd for user-mode faults only: allowed to anyone.
	raw("userfaultfd", unix.SYS_USERFAULTFD, unix.O_CLOEXEC|1 /* UFFD_USER_MODE_ONLY */)
	// bpf with an invalid command: EINVAL when allowed.
	raw("bpf", unix.SYS_BPF, 0xffff, 0, 0)
	// perf_event_open with no attributes: EFAULT when allowed.
	raw("perf_event_open", unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)
	// name_to_handle_at with no handle: EFAULT when allowed.
	p, _ := unix.BytePtrFromString("/")
	atFDCWD := unix.AT_FDCWD
	raw("name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT, uintptr(atFDCWD), uintptr(unsafe.Pointer(p)), 0, 0, 0)
	// mount of nothing: EFAULT/ENOENT/EPERM by the kernel; the filter's answer is checked in the unit test too.
	raw("mount", unix.SYS_MOUNT, 0, 0, 0, 0, 0)
	raw("setns", unix.SYS_SETNS, ^uintptr(0), 0) // EBADF when allowed
	raw("clone3", unix.SYS_CLONE3, 0, 0)         // EINVAL when allowed
	raw("personality-bsd", unix.SYS_PERSONALITY, 0x0006)
	raw("personality-query", unix.SYS_PERSONALITY, 0xffffffff)
	raw("syslog", unix.SYS_SYSLOG, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, 0, 0)
	// An empty range: 0 when allowed (ENOSYS on a kernel without NUMA).
	raw("set_mempolicy_home_node", 450 /* amd64 and arm64 */, 0, 0, 0, 0)
	for _, s := range socketTries {
		fd, err := unix.Socket(s.family, s.typ, s.proto)
		note("socket-"+s.name, err)
		if err == nil {
			unix.Close(fd)
		}
	}
	for _, s := range socketTries {
		if s.family == unix.AF_VSOCK || s.family == unix.AF_UNIX {
			fds, err := unix.Socketpair(s.family, s.typ, s.proto)
			note("socketpair-"+s.name, err)
			if err == nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
			}
		}
	}
	return res
}

// socketTries are the sockets trySyscalls opens: the families and netlink
// protocols the filter allows, and some it refuses.
var socketTries = []struct {
	name               string
	family, typ, proto int
	allowed            bool
	refusedWith        string
}{
	{"unix", unix.AF_UNIX, unix.SOCK_STREAM, 0, true, ""},
	{"inet", unix.AF_INET, unix.SOCK_STREAM, 0, true, ""},
	{"inet6", unix.AF_INET6, unix.SOCK_DGRAM, 0, true, ""},
	{"netlink-route", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, true, ""},
	{"netlink-diag", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG, true, ""},
	{"vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0, false, "EAFNOSUPPORT"},
	{"netlink-uevent", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_KOBJECT_UEVENT, false, "EPROTONOSUPPORT"},
	{"netlink-generic", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC, false, "EPROTONOSUPPORT"},
}

// runSeccompProgram runs the test binary in a jail with the level given
// and returns what it saw.
func runSeccompProgram(t *testing.T, level string, userNS bool) map[string]string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	j, err := jail.Start(jail.Spec{
		Argv: []string{"/run/jailtest", "-test.run=^$"}, Env: []string{"JAILTEST_SECCOMP=1"},
		Binds: append(jail.SystemBinds(), jail.Bind{Src: self, Dst: "/run/jailtest"}),
		UID:   2000000001, GID: 2000000001, UserNS: userNS, Seccomp: level,
	}, jail.Options{Stdout: f, Stderr: f})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.Done():
	case <-time.After(30 * time.Second):
		j.Process.Kill()
		t.Fatal("the jail did not finish")
	}
	j.Wait()
	b, _ := os.ReadFile(out)
	var res map[string]string
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("the program said %q: %v", b, err)
	}
	return res
}

// witnesses succeed, or fail with another errno, without a filter: the
// test sees the filter itself, not the kernel's own permission checks.
var witnesses = []string{"ptrace", "clone-newuser", "unshare-newuser", "process_vm_readv", "process_vm_writev",
	"pidfd_getfd", "kcmp", "keyctl", "add_key", "request_key", "io_uring_setup", "userfaultfd", "bpf",
	"perf_event_open", "name_to_handle_at", "setns", "personality-bsd", "set_mempolicy_home_node"}

func TestSeccompDeniesWhatRuntimesDeny(t *testing.T) {
	needNamespaces(t)
	modes := []bool{true}
	if os.Geteuid() == 0 {
		modes = append(modes, false)
	}
	off := runSeccompProgram(t, jail.SeccompOff, true)
	for _, w := range witnesses {
		if off[w] == "EPERM" {
			t.Errorf("without a filter %s is EPERM already: not a witness of the filter", w)
		}
	}
	for _, userNS := range modes {
		name := "uid"
		if userNS {
			name = "userns"
		}
		t.Run(name, func(t *testing.T) {
			strict := runSeccompProgram(t, jail.SeccompStrict, userNS)
			for _, w := range append(witnesses, "mount", "syslog", "unshare-newns") {
				if strict[w] != "EPERM" {
					t.Errorf("strict: %s gave %q, want EPERM (without a filter: %q)", w, strict[w], off[w])
				}
			}
			if strict["clone3"] != "ENOSYS" {
				t.Errorf("strict: clone3 gave %q, want ENOSYS (libc falls back to clone)", strict["clone3"])
			}
			for _, ok := range []string{"unshare-user", "unshare-none", "personality-query"} {
				if strict[ok] != "" {
					t.Errorf("strict: %s failed: %s", ok, strict[ok])
				}
			}

			checkSockets(t, "strict", strict, off)

			nested := runSeccompProgram(t, jail.SeccompNested, userNS)
			checkSockets(t, "nested", nested, off)
			if nested["clone-newuser"] != "" || nested["unshare-newuser"] != "" {
				t.Errorf("nested: a new user namespace was refused (%q, %q)", nested["clone-newuser"], nested["unshare-newuser"])
			}
			for _, w := range []string{"ptrace", "bpf", "keyctl", "process_vm_readv", "setns"} {
				if nested[w] != "EPERM" {
					t.Errorf("nested: %s gave %q, want EPERM", w, nested[w])
				}
			}
		})
	}
}

// checkSockets: the families (and netlink protocols) the filter allows
// open; the others are refused with the errno of a kernel without them.
// A refused one is a witness only where it opens without the filter
// (AF_VSOCK needs the vsock module, present on a VM's guest).
func checkSockets(t *testing.T, level string, got, off map[string]string) {
	t.Helper()
	for _, s := range socketTries {
		name := "socket-" + s.name
		switch {
		case s.allowed && got[name] != "":
			t.Errorf("%s: %s failed: %s", level, name, got[name])
		case !s.allowed && got[name] != s.refusedWith:
			t.Errorf("%s: %s gave %q, want %s (without a filter: %q)", level, name, got[name], s.refusedWith, off[name])
		}
	}
	if got["socketpair-unix"] != "" {
		t.Errorf("%s: socketpair(AF_UNIX) failed: %s", level, got["socketpair-unix"])
	}
	if got["socketpair-vsock"] != "EAFNOSUPPORT" {
		t.Errorf("%s: socketpair(AF_VSOCK) gave %q, want EAFNOSUPPORT", level, got["socketpair-vsock"])
	}
	if off["socket-vsock"] != "" {
		t.Logf("AF_VSOCK does not open here without a filter either (%s): only the filter's answer is checked", off["socket-vsock"])
	}
}

// A command started with StartFiltered has the filter; this process,
// and the next command it starts plainly, do not.
func TestStartFiltered(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(filtered bool) map[string]string {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), "JAILTEST_SECCOMP=1")
		var out []byte
		r, w, _ := os.Pipe()
		cmd.Stdout = w
		if filtered {
			err = jail.StartFiltered(cmd, jail.SeccompStrict)
		} else {
			err = cmd.Start()
		}
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<16)
		for {
			n, err := r.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				break
			}
		}
		cmd.Wait()
		var res map[string]string
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("the program said %q: %v", out, err)
		}
		return res
	}
	for range 3 { // the filter stays with the thread that forked, which ends
		res := run(true)
		for _, w := range []string{"ptrace", "clone-newuser", "unshare-newuser", "keyctl", "bpf"} {
			if res[w] != "EPERM" {
				t.Errorf("filtered: %s gave %q, want EPERM", w, res[w])
			}
		}
	}
	res := run(false)
	if res["clone-newuser"] != "" || res["keyctl"] != "" {
		t.Errorf("a plain command after filtered ones was filtered too: %v", res)
	}
	// Nor is this process.
	if _, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_PROCESS_KEYRING, false); errors.Is(err, unix.EPERM) {
		t.Error("the caller itself got the filter")
	}
}
