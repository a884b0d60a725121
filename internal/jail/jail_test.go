package jail_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/jail"
)

// TestMain: the test binary doubles as the program inside the jails, where
// it reports what it can reach.
func TestMain(m *testing.M) {
	switch os.Getenv("JAILTEST_PROGRAM") {
	case "1":
		inside()
		os.Exit(0)
	case "control":
		controlProgram()
	}
	os.Exit(m.Run())
}

// report is what the program found inside the jail.
type report struct {
	UID        int      `json:"uid"`
	Hostname   string   `json:"hostname"`
	Root       []string `json:"root"`
	PIDs       []string `json:"pids"`
	CapEff     string   `json:"cap_eff"`
	Secret     string   `json:"secret"`      // error reading the host's secret file
	HostDial   string   `json:"host_dial"`   // error dialing a listener of the host
	KillCaller string   `json:"kill_caller"` // error signalling the caller
	WriteUsr   string   `json:"write_usr"`
	WriteRoot  string   `json:"write_root"`
	WriteWork  string   `json:"write_work"`
	WriteTmp   string   `json:"write_tmp"`
	Relay      string   `json:"relay"` // what the relay answered
	Fd3        string   `json:"fd3"`   // content of the passed descriptor
	Passwd     string   `json:"passwd"`
	Hidden     []string `json:"hidden"` // what a hidden directory lists
	FDs        []string `json:"fds"`    // the program's descriptors
	// CapGet is the effective set as capget(2) tells it (no /proc needed),
	// BoundSysAdmin whether CAP_SYS_ADMIN is in the bounding set.
	CapGet        uint32 `json:"capget"`
	BoundSysAdmin bool   `json:"bound_sys_admin"`
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func inside() {
	var r report
	r.UID = os.Getuid()
	r.Hostname, _ = os.Hostname()
	ents, _ := os.ReadDir("/")
	for _, e := range ents {
		r.Root = append(r.Root, e.Name())
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			r.PIDs = append(r.PIDs, e.Name())
		}
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				r.CapEff = strings.TrimSpace(v)
			}
		}
	}
	_, err := os.ReadFile(os.Getenv("JAILTEST_SECRET"))
	r.Secret = errString(err)
	c, err := net.DialTimeout("tcp", os.Getenv("JAILTEST_HOST_ADDR"), 2*time.Second)
	if err == nil {
		c.Close()
	}
	r.HostDial = errString(err)
	pid, _ := strconv.Atoi(os.Getenv("JAILTEST_CALLER_PID"))
	r.KillCaller = errString(syscall.Kill(pid, 0))
	r.WriteUsr = errString(os.WriteFile("/usr/jail-escape", []byte("x"), 0o644))
	r.WriteRoot = errString(os.WriteFile("/jail-escape", []byte("x"), 0o644))
	r.WriteWork = errString(os.WriteFile("/work/out", []byte("x"), 0o644))
	r.WriteTmp = errString(os.WriteFile("/tmp/out", []byte("x"), 0o644))
	if port := os.Getenv("JAILTEST_RELAY_PORT"); port != "" {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 2*time.Second); err == nil {
			fmt.Fprintln(c, "ping")
			line, _ := bufio.NewReader(c).ReadString('\n')
			r.Relay = strings.TrimSpace(line)
			c.Close()
		} else {
			r.Relay = err.Error()
		}
	}
	passwd, _ := os.ReadFile("/etc/passwd")
	r.Passwd = string(passwd)
	hidden, _ := os.ReadDir("/work/hidden")
	for _, e := range hidden {
		r.Hidden = append(r.Hidden, e.Name())
	}
	r.FDs = ownFDs()
	var data [2]unix.CapUserData
	if unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]) == nil {
		r.CapGet = data[0].Effective | data[1].Effective
	}
	bound, _ := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0)
	r.BoundSysAdmin = bound == 1
	if f := os.NewFile(3, "fd3"); f != nil {
		b, _ := io.ReadAll(f)
		r.Fd3 = string(b)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// ownFDs lists the descriptors this process received across exec, as
// "n target": those it opened itself (the Go runtime's poller, this
// listing) are close-on-exec, and exec had closed every such one.
func ownFDs() []string {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return []string{err.Error()}
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []string
	for _, n := range names {
		fd, _ := strconv.Atoi(n)
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		l, _ := os.Readlink("/proc/self/fd/" + n)
		out = append(out, n+" "+l)
	}
	return out
}

// run starts the test binary in a jail and returns its report.
func run(t *testing.T, userNS bool) (report, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	secret := filepath.Join(host, "kek.json")
	os.WriteFile(secret, []byte("canary-kek"), 0o644)
	work := filepath.Join(host, "work")
	os.Mkdir(work, 0o777)
	os.Chmod(work, 0o777)
	os.MkdirAll(filepath.Join(work, "hidden"), 0o755)
	os.WriteFile(filepath.Join(work, "hidden", "kek.json"), []byte("canary-kek"), 0o644)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialed <- struct{}{}
			c.Close()
		}
	}()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	errf, _ := os.CreateTemp(t.TempDir(), "err")
	pr, pw, _ := os.Pipe()
	pw.Write([]byte("passed-descriptor"))
	pw.Close()
	// A descriptor the caller holds without close-on-exec, as a gateway
	// inherits one from whatever started it: it must not reach the jail.
	stray, err := syscall.Dup(int(out.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(stray)
	spec := jail.Spec{
		Argv: []string{"/run/jailtest", "-test.run=^$"},
		Env: []string{"JAILTEST_PROGRAM=1", "JAILTEST_SECRET=" + secret, "JAILTEST_HOST_ADDR=" + ln.Addr().String(),
			"JAILTEST_CALLER_PID=" + strconv.Itoa(os.Getpid()), "JAILTEST_RELAY_PORT=7100"},
		Binds: append(jail.SystemBinds(),
			jail.Bind{Src: self, Dst: "/run/jailtest"},
			jail.Bind{Src: work, Dst: "/work", Writable: true}),
		Files:  []jail.File{{Dst: "/etc/passwd", Content: "intern:x:2000000001:2000000001::/:/bin/sh\n"}},
		Hide:   []string{"/work/hidden"},
		Relays: []jail.Relay{{Port: 7100, Kind: 'e'}},
		UID:    2000000001, GID: 2000000001,
		UserNS: userNS,
	}
	j, err := jail.Start(spec, jail.Options{Stdout: out, Stderr: errf, Files: []*os.File{pr}})
	pr.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			kind, c, err := j.Accept()
			if err != nil {
				t.Log("accept:", err)
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			fmt.Fprintf(c, "%c:%s", kind, line)
			c.Close()
		}
	}()
	r := awaitReport(t, j, out, errf)
	select {
	case <-dialed:
		t.Error("a connection from inside the jail reached a listener of the host")
	default:
	}
	if _, err := os.Stat(filepath.Join(work, "out")); err != nil {
		t.Errorf("the writable bind was not written: %v", err)
	}
	return r, host
}

// awaitReport waits for the jail's program and decodes the report it wrote
// to out (its stderr in errf).
func awaitReport(t *testing.T, j *jail.Jail, out, errf *os.File) report {
	t.Helper()
	select {
	case <-j.Done():
	case <-time.After(30 * time.Second):
		j.Process.Kill()
		t.Fatal("the jail did not finish")
	}
	st, _ := j.Wait()
	b, _ := os.ReadFile(out.Name())
	e, _ := os.ReadFile(errf.Name())
	if !st.Success() {
		t.Fatalf("jail exited %v: %s%s", st, b, e)
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("report %q: %v (%s)", b, err, e)
	}
	return r
}

func needNamespaces(t *testing.T) {
	if err := jail.Probe(jail.Spec{Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001}); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("this machine cannot make jails: %v", err)
		}
		t.Skipf("SKIPPING: this machine cannot make jails: %v", err)
	}
}

func TestJail(t *testing.T) {
	needNamespaces(t)
	for _, userNS := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userNS), func(t *testing.T) {
			if !userNS && os.Geteuid() != 0 {
				t.Skip("the dedicated-uid jail needs root")
			}
			r, _ := run(t, userNS)
			wantUID := 2000000001
			if userNS {
				wantUID = jail.ProgramUID
			}
			if r.UID != wantUID {
				t.Errorf("uid %d, want %d", r.UID, wantUID)
			}
			if r.Hostname != "intern" {
				t.Errorf("hostname %q", r.Hostname)
			}
			if r.CapEff != "0000000000000000" {
				t.Errorf("effective capabilities %s, want none", r.CapEff)
			}
			// Only what the spec binds, and the jail's own /dev, /proc, /tmp.
			allowed := map[string]bool{"usr": true, "bin": true, "sbin": true, "lib": true, "lib32": true, "lib64": true,
				"libx32": true, "etc": true, "dev": true, "proc": true, "tmp": true, "run": true, "work": true}
			for _, name := range r.Root {
				if !allowed[name] {
					t.Errorf("/%s is in the jail's root", name)
				}
			}
			if len(r.PIDs) > 3 {
				t.Errorf("the jail sees pids %v: want only its init and the program", r.PIDs)
			}
			for what, err := range map[string]string{"read the host's file": r.Secret, "dial the host's loopback": r.HostDial,
				"signal the caller": r.KillCaller, "write /usr": r.WriteUsr, "write /": r.WriteRoot} {
				if err == "" {
					t.Errorf("the program could %s", what)
				}
			}
			if r.WriteWork != "" || r.WriteTmp != "" {
				t.Errorf("writes to the work dir (%s) or /tmp (%s) failed", r.WriteWork, r.WriteTmp)
			}
			if r.Relay != "e:ping" {
				t.Errorf("relay answered %q", r.Relay)
			}
			if r.Passwd != "intern:x:2000000001:2000000001::/:/bin/sh\n" {
				t.Errorf("/etc/passwd is %q, not the spec's", r.Passwd)
			}
			if len(r.Hidden) != 0 {
				t.Errorf("a hidden directory lists %v", r.Hidden)
			}
			if r.Fd3 != "passed-descriptor" {
				t.Errorf("descriptor 3 held %q", r.Fd3)
			}
			// Exactly 0-2 and the file passed: nothing the init got to do
			// its work, nothing the caller held by accident.
			if len(r.FDs) != 4 || !strings.HasPrefix(r.FDs[3], "3 pipe:") {
				t.Errorf("the program holds descriptors %q, want 0, 1, 2 and 3 (the pipe passed)", r.FDs)
			}
		})
	}
}

func TestProbeNamesTheFailure(t *testing.T) {
	needNamespaces(t)
	err := jail.Probe(jail.Spec{Binds: []jail.Bind{{Src: "/no/such/dir", Dst: "/x"}}, UID: 2000000001, GID: 2000000001})
	if err == nil || !strings.Contains(err.Error(), "bind /x") {
		t.Fatalf("probe of a missing bind: %v", err)
	}
	if err := jail.Probe(jail.Spec{Binds: []jail.Bind{{Src: "/no/such/dir", Dst: "/x", Optional: true}}, UID: 2000000001, GID: 2000000001}); err != nil {
		t.Fatalf("optional bind: %v", err)
	}
	_ = errors.New
}

// BenchmarkProbe builds a jail and exits: what the init does before the
// program starts (closing inherited descriptors included).
func BenchmarkProbe(b *testing.B) {
	spec := jail.Spec{Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001}
	for b.Loop() {
		if err := jail.Probe(spec); err != nil {
			b.Fatal(err)
		}
	}
}
