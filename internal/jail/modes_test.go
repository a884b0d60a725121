package jail_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// A jail started by a caller that is not root: its program runs as an id
// of the caller's subordinate range, with none of the caller's groups, and
// sees of /etc only what programs need. The test makes a user, with a
// group and a range, and runs this test binary as that user (the
// "gateway"), which starts the jail.

func init() {
	if os.Getenv("JAILTEST_PROGRAM") == "modes" {
		modesInside()
		os.Exit(0)
	}
}

// modesReport is what the program found.
type modesReport struct {
	UID       int               `json:"uid"`
	Groups    string            `json:"groups"`
	Read      map[string]string `json:"read"` // path → error reading it ("" read)
	Mountinfo string            `json:"mountinfo"`
	Etc       []string          `json:"etc"`
}

func modesInside() {
	r := modesReport{UID: os.Getuid(), Read: map[string]string{}}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Groups:"); ok {
				r.Groups = strings.TrimSpace(v)
			}
		}
	}
	for _, p := range strings.Split(os.Getenv("JAILTEST_SECRETS"), ",") {
		_, err := os.ReadFile(p)
		r.Read[p] = errString(err)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	r.Mountinfo = string(b)
	ents, _ := os.ReadDir("/etc")
	for _, e := range ents {
		r.Etc = append(r.Etc, e.Name())
	}
	// A directory of its own it cannot write into any more: the caller
	// must still be able to remove it.
	os.MkdirAll("/work/d/e", 0o755)
	os.WriteFile("/work/d/e/f", []byte("x"), 0o600)
	os.Chmod("/work/d/e", 0o500)
	os.Chmod("/work/d", 0o500)
	os.WriteFile("/work/out", []byte("x"), 0o644)
	json.NewEncoder(os.Stdout).Encode(r)
}

// modesGateway runs as the unprivileged user: it gives the work directory
// to the jail's user, runs the jail, removes what the program made, and
// prints the report.
func modesGateway() error {
	self, _ := os.Executable()
	work := os.Getenv("JAILTEST_WORK")
	spec := jail.Spec{
		Argv:  []string{"/run/jailtest", "-test.run=^$"},
		Env:   []string{"JAILTEST_PROGRAM=modes", "JAILTEST_SECRETS=" + os.Getenv("JAILTEST_SECRETS")},
		Binds: append(jail.SystemBinds(), jail.Bind{Src: self, Dst: "/run/jailtest"}, jail.Bind{Src: work, Dst: "/work", Writable: true}),
		SubID: 7,
	}
	uid, gid, err := jail.HostIDs(spec)
	if err != nil {
		return err
	}
	if err := jail.Chown(work, uid, gid); err != nil {
		return err
	}
	out, err := os.CreateTemp("", "out")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	var stderr strings.Builder
	errR, errW, _ := os.Pipe()
	go io.Copy(&stderr, errR)
	j, err := jail.Start(spec, jail.Options{Stdout: out, Stderr: errW})
	errW.Close()
	if err != nil {
		return err
	}
	st, _ := j.Wait()
	b, _ := os.ReadFile(out.Name())
	if !st.Success() {
		return fmt.Errorf("jail exited %v: %s%s", st, b, stderr.String())
	}
	if err := jail.RemoveAll(filepath.Join(work, "d")); err != nil {
		return fmt.Errorf("remove the program's directory: %w", err)
	}
	fmt.Printf("HOSTIDS %d %d\nREPORT %s\nSTDERR %s\n", uid, gid, b, stderr.String())
	return nil
}

func TestJailOfAnUnprivilegedCaller(t *testing.T) {
	if os.Getenv("JAILTEST_AS") == "gateway" {
		if err := modesGateway(); err != nil {
			fmt.Println("ERROR", err)
		}
		return
	}
	needNamespaces(t)
	u := testutil.NewUser(t, "cjt", true, "cjtsec")
	dir := openDir(t)
	// Files of /etc the caller can read, one as their owner and one
	// through a supplementary group: the program can read neither, nor see
	// them.
	own := "/etc/" + u.Name + "-own.secret"
	grp := "/etc/" + u.Name + "-grp.secret"
	for _, f := range []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{{own, u.UID, u.GID, 0o600}, {grp, 0, u.Groups[0], 0o640}} {
		if err := os.WriteFile(f.path, []byte("canary"), f.mode); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(f.path) })
		os.Chown(f.path, f.uid, f.gid)
		os.Chmod(f.path, f.mode)
	}
	// The work directory's parent is the caller's, as a gateway's data
	// directory is: a writable bind keeps its overlay's work beside it.
	work := filepath.Join(dir, "home", "work")
	os.MkdirAll(work, 0o700)
	os.Chown(filepath.Dir(work), u.UID, u.GID)
	os.Chown(work, u.UID, u.GID)
	bin := copySelf(t, dir)

	cmd := exec.Command(bin, "-test.run=^TestJailOfAnUnprivilegedCaller$")
	cmd.Env = []string{"JAILTEST_AS=gateway", "JAILTEST_WORK=" + work, "JAILTEST_SECRETS=" + own + "," + grp, "PATH=" + os.Getenv("PATH")}
	groups := []uint32{}
	for _, g := range u.Groups {
		groups = append(groups, uint32(g))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: groups}}
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var r modesReport
	var hostUID, hostGID int
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "REPORT "); ok {
			if err := json.Unmarshal([]byte(v), &r); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Sscanf(sc.Text(), "HOSTIDS %d %d", &hostUID, &hostGID)
	}
	if err != nil || hostUID == 0 {
		t.Fatalf("the unprivileged caller's jail: %v\n%s", err, out)
	}

	// The program's host ids are the caller's range's, not the caller's.
	if hostUID == u.UID || hostGID == u.GID || hostUID < 100000 {
		t.Errorf("the program runs as host uid %d gid %d (the caller is %d:%d)", hostUID, hostGID, u.UID, u.GID)
	}
	st, err := os.Stat(filepath.Join(work, "out"))
	if err != nil {
		t.Fatalf("the program did not write its directory: %v", err)
	}
	if o := st.Sys().(*syscall.Stat_t); int(o.Uid) != hostUID || int(o.Gid) != hostGID {
		t.Errorf("the program's file is owned by %d:%d, want %d:%d", o.Uid, o.Gid, hostUID, hostGID)
	}
	if _, err := os.Stat(filepath.Join(work, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the caller could not remove what the program made: %v", err)
	}
	if r.UID != jail.ProgramUID || r.Groups != "" {
		t.Errorf("inside: uid %d, groups %q: want %d and none", r.UID, r.Groups, jail.ProgramUID)
	}
	for p, err := range r.Read {
		if !strings.Contains(err, "no such file") {
			t.Errorf("%s: %q, want absent", p, err)
		}
	}
	checkEtc(t, r.Etc)
	for _, host := range []string{dir, u.Name} {
		if strings.Contains(r.Mountinfo, host) {
			t.Errorf("mountinfo shows the host path %s:\n%s\n%s", host, r.Mountinfo, out)
		}
	}
}

// A caller that is not root and has no subordinate range gets no jail,
// and an error that says how to add one.
func TestJailOfACallerWithoutARange(t *testing.T) {
	if os.Getenv("JAILTEST_AS") == "norange" {
		err := jail.Probe(jail.Spec{Binds: jail.SystemBinds()})
		fmt.Println("PROBE", err)
		return
	}
	needNamespaces(t)
	u := testutil.NewUser(t, "cjn", false)
	dir := openDir(t)
	bin := copySelf(t, dir)
	cmd := exec.Command(bin, "-test.run=^TestJailOfACallerWithoutARange$")
	cmd.Env = []string{"JAILTEST_AS=norange", "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "PROBE jail:") || !strings.Contains(string(out), "usermod --add-subuids") {
		t.Fatalf("probe without a range: %s", out)
	}
}

// checkEtc fails t for an entry of the jail's /etc that is not on the
// allowlist.
func checkEtc(t *testing.T, names []string) {
	t.Helper()
	allowed := map[string]bool{}
	for _, n := range jail.EtcAllowlist {
		allowed[strings.SplitN(n, "/", 2)[0]] = true
	}
	allowed["passwd"], allowed["group"] = true, true
	for _, n := range names {
		if !allowed[n] {
			t.Errorf("/etc/%s is in the jail's view", n)
		}
	}
	if len(names) == 0 {
		t.Error("the jail's /etc is empty")
	}
}

// openDir is a temporary directory other users may enter.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jailtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	return dir
}

// copySelf copies the test binary where another user can run it.
func copySelf(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "jail.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// A jail without Control ends with its caller, though its init changed
// its credentials (which clears the parent-death signal): the caller is
// killed, the init must follow. As root (a dedicated uid) and as a user
// with a range.
func TestJailEndsWithItsCaller(t *testing.T) {
	if os.Getenv("JAILTEST_AS") == "caller" {
		j, err := jail.Start(jail.Spec{Argv: []string{"/bin/sleep", "60"}, Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001, SubID: 3},
			jail.Options{})
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		fmt.Printf("INIT %d\n", j.Pid())
		time.Sleep(time.Minute)
		return
	}
	needNamespaces(t)
	u := testutil.NewUser(t, "cjd", true)
	dir := openDir(t)
	bin := copySelf(t, dir)
	for _, who := range []string{"root", "user"} {
		t.Run(who, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run=^TestJailEndsWithItsCaller$")
			cmd.Env = []string{"JAILTEST_AS=caller", "PATH=" + os.Getenv("PATH")}
			if who == "user" {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
			}
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			var pid int
			if _, err := fmt.Sscanf(line, "INIT %d", &pid); err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("caller: %q", line)
			}
			time.Sleep(200 * time.Millisecond) // the init has dropped its credentials
			cmd.Process.Kill()
			cmd.Wait()
			if !testutil.Poll(5*time.Second, func() bool {
				_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
				return err != nil
			}) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("the jail's init (pid %d) outlived its killed caller", pid)
			}
		})
	}
}

// BenchmarkJailStartModes starts and waits for a jail like an intern's (system
// directories, /etc's allowlist, a binary bound elsewhere, a writable
// directory) running /bin/true: as root, or, run as a user with a
// subordinate range, through newuidmap.
func BenchmarkJailStartModes(b *testing.B) {
	dir := b.TempDir()
	if d := os.Getenv("JAILBENCH_DIR"); d != "" {
		dir = d
	}
	work := filepath.Join(dir, "work")
	os.MkdirAll(work, 0o700)
	self, _ := os.Executable()
	spec := jail.Spec{Argv: []string{"/bin/true"},
		Binds: append(jail.SystemBinds(), jail.Bind{Src: self, Dst: "/run/bin"}, jail.Bind{Src: work, Dst: "/intern", Writable: true}),
		UID:   2000000001, GID: 2000000001, SubID: 1}
	for i := 0; i < b.N; i++ {
		j, err := jail.Start(spec, jail.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if st, _ := j.Wait(); !st.Success() {
			b.Fatal(st)
		}
	}
}

// A Control jail of a caller that is not root outlives it, and the next
// process of the same user takes it over (a gateway restart).
func TestControlJailOfAnUnprivilegedCaller(t *testing.T) {
	switch os.Getenv("JAILTEST_AS") {
	case "first":
		j, err := jail.Start(jail.Spec{Argv: []string{"/bin/sleep", "60"}, Binds: jail.SystemBinds(), SubID: 5,
			Control: os.Getenv("JAILTEST_CONTROL"), Orphan: 30 * time.Second, Tag: "the-tag"}, jail.Options{})
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		fmt.Println("STARTED", j.Pid())
		return
	case "next":
		j, err := jail.Attach(os.Getenv("JAILTEST_CONTROL"), nil)
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		fmt.Println("ATTACHED", j.Tag())
		j.Kill()
		<-j.Done()
		return
	}
	needNamespaces(t)
	u := testutil.NewUser(t, "cjc", true)
	dir := openDir(t)
	bin := copySelf(t, dir)
	ctl := filepath.Join(dir, "jails")
	os.Mkdir(ctl, 0o700)
	os.Chown(ctl, u.UID, u.GID)
	as := func(role string) string {
		cmd := exec.Command(bin, "-test.run=^TestControlJailOfAnUnprivilegedCaller$")
		cmd.Env = []string{"JAILTEST_AS=" + role, "JAILTEST_CONTROL=" + filepath.Join(ctl, "j.sock"), "PATH=" + os.Getenv("PATH")}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	out := as("first")
	var pid int
	if _, err := fmt.Sscanf(out, "STARTED %d", &pid); err != nil {
		t.Fatalf("first caller: %s", out)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if out := as("next"); !strings.HasPrefix(out, "ATTACHED the-tag") {
		t.Fatalf("the next caller: %s", out)
	}
	if !testutil.Poll(5*time.Second, func() bool { _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); return err != nil }) {
		t.Fatal("the jail did not end when the next caller killed it")
	}
}

// A caller that is not root and may not make cgroups is told how to let
// it (delegation), not only that mkdir was refused.
func TestLimitsOfACallerWithoutCgroupsNameTheFix(t *testing.T) {
	if os.Getenv("JAILTEST_AS") == "nocgroups" {
		fmt.Println("LIMITS", strings.Join(jail.CheckLimits(jail.Limits{Memory: 64 << 20, Pids: 100}), " | "))
		return
	}
	needNamespaces(t)
	u := testutil.NewUser(t, "cjc", false)
	dir := openDir(t)
	bin := copySelf(t, dir)
	cmd := exec.Command(bin, "-test.run=^TestLimitsOfACallerWithoutCgroupsNameTheFix$")
	cmd.Env = []string{"JAILTEST_AS=nocgroups", "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "LIMITS ") {
		t.Fatalf("the probe did not run: %s", out)
	}
	if strings.Contains(string(out), "permission denied") && !strings.Contains(string(out), "Delegate=yes") {
		t.Fatalf("a refused cgroup without its remedy: %s", out)
	}
	if !strings.Contains(string(out), "permission denied") {
		t.Skipf("this host lets an unprivileged user make cgroups: %s", out)
	}
}
