//go:build linux

package jail

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Where each controller is found: a v2-only host, a hybrid one like this
// CI's (v1 controllers, an empty unified hierarchy), and a v2 hierarchy
// mounted below its root (a container's cgroup namespace is not needed).
func TestFindHierarchies(t *testing.T) {
	v2Info := "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	hybridInfo := `32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	cases := []struct {
		name, info, own, controllers string
		want                         map[string]string // controller → "v1|v2 base"
	}{
		{"v2", v2Info, "0::/system.slice/cohort.service\n", "cpuset cpu io memory pids",
			map[string]string{"memory": "v2 /sys/fs/cgroup/system.slice/cohort.service", "pids": "v2 /sys/fs/cgroup/system.slice/cohort.service", "cpu": "v2 /sys/fs/cgroup/system.slice/cohort.service"}},
		{"v2 without pids delegated", v2Info, "0::/a\n", "memory cpu",
			map[string]string{"memory": "v2 /sys/fs/cgroup/a", "cpu": "v2 /sys/fs/cgroup/a"}},
		{"hybrid", hybridInfo, "8:pids:/\n4:memory:/process_api/x\n1:cpu:/\n0::/\n", "hugetlb",
			map[string]string{"memory": "v1 /sys/fs/cgroup/memory/process_api/x", "pids": "v1 /sys/fs/cgroup/pids", "cpu": "v1 /sys/fs/cgroup/cpu"}},
		{"hybrid, co-mounted cpu,cpuacct", strings.Replace(hybridInfo, "rw,cpu\n", "rw,cpu,cpuacct\n", 1), "2:cpu,cpuacct:/u\n0::/\n", "",
			map[string]string{"cpu": "v1 /sys/fs/cgroup/cpu/u"}},
		{"mounted below its root", "30 23 0:26 /ns /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/ns/jailer\n", "memory pids cpu",
			map[string]string{"memory": "v2 /sys/fs/cgroup/jailer", "pids": "v2 /sys/fs/cgroup/jailer", "cpu": "v2 /sys/fs/cgroup/jailer"}},
		{"none", "", "", "", map[string]string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := findHierarchies(c.info, c.own, func(string) string { return c.controllers })
			if len(got) != len(c.want) {
				t.Fatalf("got %d controllers, want %v", len(got), c.want)
			}
			for ctrl, w := range c.want {
				h := got[ctrl]
				if h == nil {
					t.Fatalf("%s: not found", ctrl)
				}
				v := "v1"
				if h.v2 {
					v = "v2"
				}
				if v+" "+h.base != w {
					t.Errorf("%s: %s %s, want %s", ctrl, v, h.base, w)
				}
			}
		})
	}
}

// The v2 path for real on this host's unified hierarchy, which holds no
// limit controller here: a jail's cgroup is made under this process's own,
// the init's pid goes in, an adopting caller finds it from
// /proc/<pid>/cgroup ("0::…"), and it is removed when empty. (The limit
// files themselves need the controllers: TestFindHierarchies and the v1
// tests cover the rest.)
func TestV2PlacementAndCleanup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	own := readFile("/proc/self/cgroup")
	var v2path string
	for _, l := range strings.Split(own, "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			v2path = p
		}
	}
	mnt := "/sys/fs/cgroup/unified"
	if v2path == "" || !exists(filepath.Join(mnt, "cgroup.procs")) {
		t.Skip("no cgroup v2 hierarchy at " + mnt)
	}
	h := &hierarchy{v2: true, mnt: mnt, root: "/"}
	h.base = h.dir(v2path)
	// A child process of ours, moved in as Start moves an init.
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "30"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	dir := filepath.Join(h.base, cgroupPrefix+strconv.Itoa(p.Pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeFile1(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(p.Pid)); err != nil {
		t.Fatal(err)
	}
	saved := cgroupHosts()
	hosts = map[string]*hierarchy{"memory": h}
	defer func() { hosts = saved }()
	found := jailCgroups(p.Pid)
	if len(found) != 1 || found[0] != dir {
		t.Fatalf("jailCgroups found %v, want [%s]", found, dir)
	}
	removeCgroups(found, 0)
	if !exists(dir) {
		t.Fatal("a cgroup with a process in it was removed")
	}
	p.Kill()
	p.Wait()
	removeCgroups(found, 5e9)
	if exists(dir) {
		t.Fatalf("%s outlived its last process", dir)
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// SweepCgroups removes an empty jail cgroup left from before (a jail that
// ended with no caller attached), not one made a moment ago.
func TestSweepCgroups(t *testing.T) {
	h := cgroupHosts()["pids"]
	if h == nil || os.Geteuid() != 0 {
		t.Skip("no pids cgroup, or not root")
	}
	old := filepath.Join(h.base, cgroupPrefix+"sweep-old")
	fresh := filepath.Join(h.base, cgroupPrefix+"sweep-fresh")
	for _, d := range []string{old, fresh} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(d)
	}
	then := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(old, then, then); err != nil {
		t.Skipf("cannot age a cgroup directory here: %v", err)
	}
	SweepCgroups()
	if exists(old) {
		t.Error("an empty jail cgroup from before was not swept")
	}
	if !exists(fresh) {
		t.Error("a jail cgroup made a moment ago was swept")
	}
}

// A host without the controllers: CheckLimits names each limit it cannot
// enforce, and Start runs the jail without a cgroup rather than failing.
func TestCheckLimitsWithoutControllers(t *testing.T) {
	saved := cgroupHosts()
	hosts = map[string]*hierarchy{}
	defer func() { hosts = saved }()
	got := CheckLimits(Limits{Memory: 1 << 30, Pids: 10, CPUWeight: 100, Tmpfs: 1 << 20})
	if len(got) != 3 || !strings.Contains(got[0], "memory limit: no memory cgroup controller") ||
		!strings.Contains(got[1], "process limit") || !strings.Contains(got[2], "CPU share") {
		t.Fatalf("CheckLimits said %q", got)
	}
	dirs, err := placeInCgroups(Limits{Memory: 1 << 30}, os.Getpid())
	if err != nil || len(dirs) != 0 {
		t.Fatalf("placeInCgroups without controllers: %v %v", dirs, err)
	}
}

// Socket buffers: where a jail's would escape its memory limit, the
// warning at start says so (v1 without the TCP file, v2 booted with
// cgroup.memory=nosocket); where they are charged, it says nothing.
func TestSocketMemoryGap(t *testing.T) {
	v1 := &hierarchy{mnt: "/sys/fs/cgroup/memory", root: "/", base: "/sys/fs/cgroup/memory/gw"}
	v2 := &hierarchy{v2: true, mnt: "/sys/fs/cgroup", root: "/", base: "/sys/fs/cgroup/gw"}
	has := func(string) bool { return true }
	lacks := func(string) bool { return false }
	if got := socketMemoryGap(v1, "quiet", has); got != "" {
		t.Errorf("v1 with %s: %q, want nothing", tcpLimitFile, got)
	}
	if got := socketMemoryGap(v1, "quiet", lacks); !strings.Contains(got, "socket buffers") || !strings.Contains(got, tcpLimitFile) {
		t.Errorf("v1 without %s: %q", tcpLimitFile, got)
	}
	if got := socketMemoryGap(v2, "quiet splash", lacks); got != "" {
		t.Errorf("v2: %q, want nothing (v2 charges socket memory)", got)
	}
	if got := socketMemoryGap(v2, "quiet cgroup.memory=nosocket", lacks); !strings.Contains(got, "socket buffers") || !strings.Contains(got, "nosocket") {
		t.Errorf("v2 booted with nosocket: %q", got)
	}
	// This host: where CheckLimits finds nothing to say of the memory
	// limit, the jail's cgroup has the TCP limit written (v1) or needs
	// none (v2).
	h := cgroupHosts()["memory"]
	if h == nil || os.Geteuid() != 0 {
		return
	}
	for _, p := range CheckLimits(Limits{Memory: 64 << 20}) {
		t.Logf("this host: %s", p)
	}
	dirs, err := makeCgroups(Limits{Memory: 64 << 20}, "sockmem-"+strconv.Itoa(os.Getpid()), 0)
	defer removeCgroups(dirs, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !h.v2 && len(dirs) == 1 && exists(filepath.Join(dirs[0], tcpLimitFile)) {
		if got := strings.TrimSpace(readFile(filepath.Join(dirs[0], tcpLimitFile))); got != strconv.Itoa(64<<20) {
			t.Errorf("%s of a jail's v1 cgroup is %s, want the memory limit %d", tcpLimitFile, got, 64<<20)
		}
	}
}
