package jail_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
)

// shell runs script with sh in a jail bounded by l (the host's uid path
// when root, else a user namespace) and returns its output, its status
// and the init's cgroup directories as the host sees them while it ran.
func shell(t *testing.T, l jail.Limits, script string) (out string, code int, cgroups []string) {
	t.Helper()
	needNamespaces(t)
	work := t.TempDir()
	os.Chmod(work, 0o777)
	outf, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	spec := jail.Spec{
		Argv:  []string{"/bin/sh", "-c", script},
		Env:   []string{"PATH=/usr/bin:/bin"},
		Binds: append(jail.SystemBinds(), jail.Bind{Src: work, Dst: "/work", Writable: true}),
		UID:   2000000001, GID: 2000000001,
		Limits: l,
	}
	j, err := jail.Start(spec, jail.Options{Stdout: outf, Stderr: outf})
	if err != nil {
		t.Fatal(err)
	}
	cgroups = hostCgroups(j.Pid())
	select {
	case <-j.Done():
	case <-time.After(3 * time.Minute):
		j.Kill()
		t.Fatal("the jail did not finish")
	}
	st, _ := j.Wait()
	b, _ := os.ReadFile(outf.Name())
	return string(b), st.ExitCode(), cgroups
}

// hostCgroups lists the cohort-jail-* cgroup directories pid is in.
func hostCgroups(pid int) []string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(filepath.Base(parts[2]), "cohort-jail-") {
			continue
		}
		ctrl := strings.Split(parts[1], ",")[0]
		if parts[0] == "0" {
			out = append(out, "/sys/fs/cgroup/unified"+parts[2])
			continue
		}
		// The v1 hierarchies of this host are mounted at their root.
		if m := "/sys/fs/cgroup/" + ctrl; exists(m) {
			out = append(out, m+parts[2])
		}
	}
	return out
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func needCgroups(t *testing.T, l jail.Limits) {
	t.Helper()
	if problems := jail.CheckLimits(l); len(problems) > 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this host cannot enforce the limits: %v", problems)
		}
		t.Skipf("SKIPPING: this host cannot enforce the limits: %v", problems)
	}
}

// The default process limit refuses a 2,000-process fork storm: fork
// fails in the jail (its shell says so), and no more than the limit ever
// runs at once.
func TestLimitsRefuseTwoThousandProcesses(t *testing.T) {
	l := jail.Limits{Pids: 1024}
	needCgroups(t, l)
	// dash gives up at the first refused fork; the shell after it counts
	// with builtins only (no fork left).
	out, code, cg := shell(t, l, `(for i in $(seq 2000); do sleep 30 & done); set -- /proc/[0-9]*; echo "running $#"; kill -9 -1; exit 0`)
	var running int
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "running "); ok {
			running, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if running == 0 || running > 1024 {
		t.Fatalf("%d processes ran in a jail limited to 1,024 (output %q, status %d)", running, tail(out), code)
	}
	if !strings.Contains(out, "fork") || !strings.Contains(out, "Resource temporarily unavailable") && !strings.Contains(out, "Cannot fork") {
		t.Errorf("the refused fork said nothing clear: %q", tail(out))
	}
	t.Logf("%d processes ran; the rest were refused: %q", running, tail(out))
	if len(cg) == 0 {
		t.Fatal("the jail's init is in no cohort-jail cgroup")
	}
	gone(t, cg)
}

// The default memory limit stops a 5 GiB hog: the kernel's OOM killer ends
// it (SIGKILL, status 137) in this jail, which itself runs on.
func TestLimitsOOMKillAFiveGiBHog(t *testing.T) {
	l := jail.Limits{Memory: 4 << 30}
	needCgroups(t, l)
	// tail keeps its last line in memory: 5 GiB of zeros with no newline.
	out, code, cg := shell(t, l, `head -c 5368709120 /dev/zero | tail > /dev/null; echo "hog status $?"; echo still here`)
	if code != 0 || !strings.Contains(out, "hog status 137") || !strings.Contains(out, "still here") {
		t.Fatalf("the 5 GiB hog was not OOM-killed in a 4 GiB jail: status %d, output %q", code, tail(out))
	}
	gone(t, cg)
}

// /tmp and /dev/shm are sized: a write past the size fails with ENOSPC.
func TestLimitsTmpfsFull(t *testing.T) {
	l := jail.Limits{Tmpfs: 16 << 20}
	out, _, _ := shell(t, l, `for d in /tmp /dev/shm; do head -c 33554432 /dev/zero > $d/fill; echo "$d $? $(wc -c < $d/fill)"; done 2>&1`)
	for _, d := range []string{"/tmp", "/dev/shm"} {
		if !strings.Contains(out, d+" 1 16777216") && !strings.Contains(out, d+" 1 1677") {
			t.Errorf("%s: a 32 MiB write to a 16 MiB tmpfs did not stop at 16 MiB: %q", d, tail(out))
		}
	}
	if strings.Count(out, "No space left on device") < 2 {
		t.Errorf("the full tmpfs said nothing clear: %q", tail(out))
	}
}

// RLIMIT_FSIZE: no file of the jail grows past FileSize, in its writable
// directory either.
func TestLimitsFileSize(t *testing.T) {
	l := jail.Limits{FileSize: 8 << 20}
	out, _, _ := shell(t, l, `head -c 16777216 /dev/zero > /work/fill; echo "status $? size $(wc -c < /work/fill)"`)
	if !strings.Contains(out, "size 8388608") || strings.Contains(out, "status 0") {
		t.Fatalf("a 16 MiB write was not stopped at 8 MiB: %q", tail(out))
	}
}

// The CPU share and cap are written as asked; the cgroups go with the jail.
func TestLimitsCPUShareAndCleanup(t *testing.T) {
	l := jail.Limits{CPUWeight: 50, CPUs: 0.5, Pids: 100}
	needCgroups(t, l)
	needNamespaces(t)
	spec := jail.Spec{Argv: []string{"/bin/sleep", "5"}, Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001, Limits: l}
	j, err := jail.Start(spec, jail.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cg := hostCgroups(j.Pid())
	found := false
	for _, d := range cg {
		if b, err := os.ReadFile(filepath.Join(d, "cpu.shares")); err == nil {
			found = true
			if strings.TrimSpace(string(b)) != "512" {
				t.Errorf("cpu.shares %s, want 512 for weight 50", b)
			}
		}
		if b, err := os.ReadFile(filepath.Join(d, "cpu.cfs_quota_us")); err == nil && strings.TrimSpace(string(b)) != "50000" {
			t.Errorf("cpu.cfs_quota_us %s, want 50000 for half a CPU", b)
		}
		if b, err := os.ReadFile(filepath.Join(d, "cpu.max")); err == nil && strings.TrimSpace(string(b)) != "50000 100000" {
			t.Errorf("cpu.max %s, want half a CPU", b)
		}
		if b, err := os.ReadFile(filepath.Join(d, "cpu.weight")); err == nil {
			found = true
			if strings.TrimSpace(string(b)) != "50" {
				t.Errorf("cpu.weight %s, want 50", b)
			}
		}
	}
	if !found {
		t.Fatalf("no CPU share among the jail's cgroups %v", cg)
	}
	j.Kill()
	j.Wait()
	gone(t, cg)
}

// gone checks that a finished jail left no cgroup behind.
func gone(t *testing.T, dirs []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, d := range dirs {
		for exists(d) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if exists(d) {
			t.Errorf("the jail's cgroup %s outlived it", d)
		}
	}
}

func tail(s string) string {
	if len(s) > 600 {
		return "…" + s[len(s)-600:]
	}
	return s
}

// BenchmarkJailStart: a jail's start to its program's exit (/bin/true)
// and its cgroups' removal (Wait), with no limits, with each one alone,
// and with the defaults.
func BenchmarkJailStart(b *testing.B) {
	for _, c := range []struct {
		name string
		l    jail.Limits
	}{
		{"none", jail.Limits{}},
		{"memory", jail.Limits{Memory: 4 << 30}},
		{"pids", jail.Limits{Pids: 1024}},
		{"cpu", jail.Limits{CPUWeight: 100}},
		{"tmpfs+fsize", jail.Limits{Tmpfs: 1 << 30, FileSize: 10 << 30}},
		{"cpu-cap", jail.Limits{CPUs: 1}},
		{"defaults", jail.Limits{Memory: 4 << 30, Pids: 1024, CPUWeight: 100, CPUs: 1, Tmpfs: 1 << 30, FileSize: 10 << 30}},
	} {
		b.Run(c.name, func(b *testing.B) {
			spec := jail.Spec{Argv: []string{"/bin/true"}, Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001, Limits: c.l}
			for b.Loop() {
				j, err := jail.Start(spec, jail.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if st, _ := j.Wait(); !st.Success() {
					b.Fatal(st)
				}
			}
		})
	}
}

// The test binary, started with JAILTEST_STARTER=<control path>, starts a
// Control jail with limits and exits at once: a gateway that goes before
// its jail, leaving the cleanup to whoever adopts it.
func init() {
	ctl := os.Getenv("JAILTEST_STARTER")
	if ctl == "" {
		return
	}
	j, err := jail.Start(jail.Spec{Argv: []string{"/bin/sleep", "60"}, Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001,
		Control: ctl, Orphan: time.Minute, Limits: jail.Limits{Memory: 1 << 30, Pids: 100, CPUWeight: 100}}, jail.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Until the init has its spec (Start writes it after returning): it
	// greets a caller only once its program runs. (Alive is no sign: the
	// control socket listens from Start on, bound by the caller.)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if a, err := jail.Attach(ctl, nil); err == nil {
			a.Detach()
			break
		}
	}
	fmt.Println(j.Pid())
	os.Exit(0)
}

// A gateway that adopts a jail (Attach) removes its cgroups when it ends,
// though another process made them.
func TestLimitsAdoptedJailCgroupsRemoved(t *testing.T) {
	l := jail.Limits{Memory: 1 << 30, Pids: 100, CPUWeight: 100}
	needCgroups(t, l)
	needNamespaces(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctl := filepath.Join(t.TempDir(), "ctl.sock")
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "JAILTEST_STARTER="+ctl)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("starter: %v", err)
	}
	pid := 0
	fmt.Sscan(string(out), &pid)
	cg := hostCgroups(pid)
	if len(cg) < 3 {
		t.Fatalf("the jail's init %d is in cgroups %v, want memory, pids and cpu", pid, cg)
	}
	j, err := jail.Attach(ctl, nil)
	if err != nil {
		t.Fatal(err)
	}
	j.Kill()
	<-j.Done()
	gone(t, cg)
}
