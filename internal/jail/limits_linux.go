package jail

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A hierarchy is where one cgroup controller lives on this host.
type hierarchy struct {
	v2 bool
	// mnt and root are the hierarchy's mount point and the cgroup path it
	// shows there; base is the caller's own cgroup in it, under which
	// Start makes each jail's.
	mnt, root, base string
}

// dir is the directory of cgroup path p (as /proc/<pid>/cgroup names it).
func (h *hierarchy) dir(p string) string {
	rel, err := filepath.Rel(h.root, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		rel = p
	}
	return filepath.Join(h.mnt, rel)
}

// limitControllers are the controllers Limits use.
var limitControllers = []string{"memory", "pids", "cpu"}

var (
	hostsOnce sync.Once
	hosts     map[string]*hierarchy // controller → its hierarchy; absent: none
	v2Mu      sync.Mutex
	v2Ready   error // prepareV2's result, once it succeeded or failed for good
	v2Tried   bool
)

// cgroupHosts finds, once, where memory, pids and cpu are: on the unified
// (v2) hierarchy when it has them, else on a v1 hierarchy of their own.
func cgroupHosts() map[string]*hierarchy {
	hostsOnce.Do(func() {
		mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
		own, _ := os.ReadFile("/proc/self/cgroup")
		hosts = findHierarchies(string(mountinfo), string(own), func(p string) string {
			b, _ := os.ReadFile(p)
			return string(b)
		})
	})
	return hosts
}

// findHierarchies reads /proc/self/mountinfo and /proc/self/cgroup
// (read returns a file's content: the v2 root's cgroup.controllers).
func findHierarchies(mountinfo, own string, read func(string) string) map[string]*hierarchy {
	ownPath := map[string]string{} // controller ("" for v2) → own cgroup
	for _, l := range strings.Split(own, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			ownPath[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			ownPath[c] = parts[2]
		}
	}
	var v2 *hierarchy
	v1 := map[string]*hierarchy{}
	for _, l := range strings.Split(mountinfo, "\n") {
		left, right, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 {
			continue
		}
		root, mnt := lf[3], lf[4]
		switch rf[0] {
		case "cgroup2":
			if p, ok := ownPath[""]; ok && v2 == nil {
				v2 = &hierarchy{v2: true, mnt: mnt, root: root}
				v2.base = v2.dir(p)
			}
		case "cgroup":
			for _, opt := range strings.Split(rf[2], ",") {
				if p, ok := ownPath[opt]; ok && slices.Contains(limitControllers, opt) && v1[opt] == nil {
					h := &hierarchy{mnt: mnt, root: root}
					h.base = h.dir(p)
					v1[opt] = h
				}
			}
		}
	}
	out := map[string]*hierarchy{}
	var onV2 []string
	if v2 != nil {
		onV2 = strings.Fields(read(filepath.Join(v2.mnt, "cgroup.controllers")))
	}
	for _, c := range limitControllers {
		switch {
		case slices.Contains(onV2, c):
			out[c] = v2
		case v1[c] != nil:
			out[c] = v1[c]
		}
	}
	return out
}

// wanted lists the controllers l needs.
func (l Limits) wanted() []string {
	var out []string
	if l.Memory > 0 {
		out = append(out, "memory")
	}
	if l.Pids > 0 {
		out = append(out, "pids")
	}
	if l.CPUWeight > 0 || l.CPUs > 0 {
		out = append(out, "cpu")
	}
	return out
}

// CheckLimits reports which of l this host cannot enforce for a jail
// started by this process, each with the reason: a missing controller,
// or a cgroup this process may not make. An empty answer means all of
// them hold (RLIMIT_FSIZE and tmpfs sizes always do).
func CheckLimits(l Limits) []string {
	var out []string
	hs := cgroupHosts()
	for _, c := range l.wanted() {
		if hs[c] == nil {
			out = append(out, fmt.Sprintf("%s: no %s cgroup controller is mounted (cgroup v2 or v1)", limitName(c), c))
		}
	}
	if len(out) == len(l.wanted()) {
		return out
	}
	if err := cgroupsUsable(l); err != nil {
		hint := ""
		if errors.Is(err, fs.ErrPermission) && os.Geteuid() != 0 {
			// The usual case: a gateway that is not root, whose own cgroup
			// was not delegated to it.
			hint = "; run the gateway as root, or as a systemd service with Delegate=yes (or under systemd-run --user --scope -p Delegate=yes) so that it may make cgroups under its own"
		}
		out = append(out, fmt.Sprintf("memory, processes and CPU share: %v%s", err, hint))
	} else if h := hs["memory"]; l.Memory > 0 && h != nil {
		if gap := socketMemoryGap(h, readFile("/proc/cmdline"), pathExists); gap != "" {
			out = append(out, gap)
		}
	}
	return out
}

// socketMemoryGap says why a jail's socket buffers (TCP's send and receive
// queues, kernel memory the sockets hold) escape its memory limit on this
// host, or "" when they do not. On cgroup v2 they are charged to the
// cgroup's memory with the rest, unless the kernel was booted with
// cgroup.memory=nosocket. On v1 they are charged only to a cgroup whose
// memory.kmem.tcp.limit_in_bytes was written (writeLimit writes it), a
// file a kernel without kernel memory accounting lacks: then 400
// connections filled without reading hold gigabytes of the host's memory
// while the cgroup shows megabytes.
func socketMemoryGap(h *hierarchy, cmdline string, exists func(string) bool) string {
	if h.v2 {
		if slices.Contains(strings.Fields(cmdline), "cgroup.memory=nosocket") {
			return "socket buffers (memory limit): the kernel was booted with cgroup.memory=nosocket, so a jail's TCP buffers are not charged to its memory limit"
		}
		return ""
	}
	if !exists(filepath.Join(h.base, tcpLimitFile)) {
		return "socket buffers (memory limit): the v1 memory controller has no " + tcpLimitFile + " (a kernel without CONFIG_MEMCG_KMEM, or one that removed it), so a jail's TCP buffers are not charged to its memory limit; cgroup v2 charges them"
	}
	return ""
}

// tcpLimitFile bounds a v1 memory cgroup's TCP buffers, and makes the
// kernel charge them at all.
const tcpLimitFile = "memory.kmem.tcp.limit_in_bytes"

func pathExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

var (
	usableOnce sync.Once
	usableErr  error
)

// cgroupsUsable makes and removes a cgroup the way Start does, once per
// process: a host where this fails (no delegation to a user-namespace
// gateway, a v2 cgroup shared with other processes) runs jails without
// cgroups, as CheckLimits said at start; one where it works has every
// jail's cgroup or no jail.
func cgroupsUsable(l Limits) error {
	usableOnce.Do(func() {
		dirs, err := makeCgroups(l, "probe-"+strconv.Itoa(os.Getpid()), 0)
		removeCgroups(dirs, 0)
		usableErr = err
	})
	return usableErr
}

func limitName(c string) string {
	return map[string]string{"memory": "memory limit", "pids": "process limit", "cpu": "CPU share"}[c]
}

// placeInCgroups makes the jail's cgroups and moves its init (pid) into
// them, before the init reads its spec: everything in the jail is in them
// from its first instruction. Controllers the host lacks are skipped
// (CheckLimits says so at start); one that exists and fails is an error.
func placeInCgroups(l Limits, pid int) ([]string, error) {
	if !l.cgroups() || cgroupsUsable(l) != nil {
		return nil, nil
	}
	dirs, err := makeCgroups(l, strconv.Itoa(pid), pid)
	if err != nil {
		removeCgroups(dirs, 0)
		return nil, fmt.Errorf("jail: limits: %w", err)
	}
	return dirs, nil
}

// makeCgroups makes <base>/cohort-jail-<name> in each hierarchy l needs,
// writes the limits, and moves pid (when not 0) in. It returns the
// directories it made, even on error.
func makeCgroups(l Limits, name string, pid int) ([]string, error) {
	hs := cgroupHosts()
	byDir := map[*hierarchy][]string{}
	var order []*hierarchy
	for _, c := range l.wanted() {
		h := hs[c]
		if h == nil {
			continue
		}
		if byDir[h] == nil {
			order = append(order, h)
		}
		byDir[h] = append(byDir[h], c)
	}
	var dirs []string
	for _, h := range order {
		ctrls := byDir[h]
		if h.v2 {
			if err := prepareV2(h, ctrls); err != nil {
				return dirs, err
			}
		}
		dir := filepath.Join(h.base, cgroupPrefix+name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return dirs, fmt.Errorf("make cgroup %s: %w", dir, err)
		}
		dirs = append(dirs, dir)
		for _, c := range ctrls {
			if err := writeLimit(dir, c, h.v2, l); err != nil {
				return dirs, err
			}
		}
		if pid > 0 {
			if err := writeFile1(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
				return dirs, err
			}
		}
	}
	return dirs, nil
}

// writeLimit writes controller c's limit from l in dir.
func writeLimit(dir, c string, v2 bool, l Limits) error {
	set := func(file, v string) error { return writeFile1(filepath.Join(dir, file), v) }
	optional := func(file, v string) {
		if _, err := os.Stat(filepath.Join(dir, file)); err == nil {
			set(file, v)
		}
	}
	mem := strconv.FormatInt(l.Memory, 10)
	switch {
	case c == "memory" && v2:
		if err := set("memory.max", mem); err != nil {
			return err
		}
		// No swapping past the limit: a hog is stopped, not slowed into
		// the host's swap.
		optional("memory.swap.max", "0")
	case c == "memory":
		if err := set("memory.limit_in_bytes", mem); err != nil {
			return err
		}
		optional("memory.memsw.limit_in_bytes", mem)
		// Socket buffers: v1 charges them to a counter of their own, and
		// only once its limit is written (before any socket of the jail
		// exists: a socket is charged to the cgroup it was made in, from
		// then on). The same figure as the memory limit: a jail's TCP
		// queues hold no more of the host than that. Where the file is
		// missing, CheckLimits says so at start.
		if pathExists(filepath.Join(dir, tcpLimitFile)) {
			if err := set(tcpLimitFile, mem); err != nil {
				return err
			}
		}
	case c == "pids":
		return set("pids.max", strconv.Itoa(l.Pids))
	case c == "cpu":
		return writeCPU(dir, v2, l)
	}
	return nil
}

// writeCPU writes the CPU share (a weight) and cap (a quota per 100 ms).
func writeCPU(dir string, v2 bool, l Limits) error {
	set := func(file, v string) error { return writeFile1(filepath.Join(dir, file), v) }
	const period = 100000 // µs
	quota := int64(l.CPUs * period)
	if l.CPUWeight > 0 {
		var err error
		if v2 {
			err = set("cpu.weight", strconv.Itoa(min(max(l.CPUWeight, 1), 10000)))
		} else {
			err = set("cpu.shares", strconv.Itoa(max(l.CPUWeight*1024/100, 2)))
		}
		if err != nil {
			return err
		}
	}
	if quota <= 0 {
		return nil
	}
	quota = max(quota, 1000)
	if v2 {
		return set("cpu.max", fmt.Sprintf("%d %d", quota, period))
	}
	if err := set("cpu.cfs_period_us", strconv.Itoa(period)); err != nil {
		return err
	}
	return set("cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}

// writeFile1 writes one value to a cgroup file, naming the file on error.
func writeFile1(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(v)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("write %s to %s: %w", v, path, err)
	}
	return nil
}

// prepareV2 enables ctrls for the children of the caller's own v2
// cgroup. v2 lets a cgroup hand controllers down only while it holds no
// process itself (unless it is the root): a gateway alone in its cgroup
// (a systemd unit with Delegate=yes, a container) first moves itself into
// a leaf of its own, cohort-gateway. One sharing its cgroup with other
// processes (a login shell's) cannot, and the error says what to do.
func prepareV2(h *hierarchy, ctrls []string) error {
	v2Mu.Lock()
	defer v2Mu.Unlock()
	if v2Tried {
		return v2Ready
	}
	enable := func() error {
		var s strings.Builder
		for _, c := range limitControllers {
			if slices.Contains(strings.Fields(readFile(filepath.Join(h.base, "cgroup.controllers"))), c) {
				fmt.Fprintf(&s, "+%s ", c)
			}
		}
		for _, c := range ctrls {
			if !strings.Contains(s.String(), "+"+c+" ") {
				return fmt.Errorf("the %s controller is not delegated to this process's cgroup %s (enable it in the parent's cgroup.subtree_control, or run under systemd with Delegate=yes)", c, h.base)
			}
		}
		return writeFile1(filepath.Join(h.base, "cgroup.subtree_control"), strings.TrimSpace(s.String()))
	}
	err := enable()
	if errors.Is(err, unix.EBUSY) {
		leaf := filepath.Join(h.base, "cohort-gateway")
		if err = os.Mkdir(leaf, 0o755); err == nil || errors.Is(err, os.ErrExist) {
			err = writeFile1(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(os.Getpid()))
		}
		if err == nil {
			err = enable()
		}
		if err != nil {
			err = fmt.Errorf("cgroup v2: %s holds other processes than this one, and a cgroup that holds processes cannot hand controllers to its children: run the gateway in a cgroup of its own (systemd Delegate=yes, a container): %w", h.base, err)
		}
	}
	v2Tried, v2Ready = true, err
	return err
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// removeCgroups removes a jail's cgroups once they are empty, waiting up
// to wait for the last processes to go (a killed jail's take a moment).
func removeCgroups(dirs []string, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for _, d := range dirs {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// jailCgroups finds the cgroups Start made for the init pid, from
// /proc/<pid>/cgroup: the ones an adopting caller removes when the jail
// ends, wherever its first caller's own cgroup was.
func jailCgroups(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil
	}
	hs := cgroupHosts()
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(filepath.Base(parts[2]), cgroupPrefix) {
			continue
		}
		var h *hierarchy
		for _, c := range limitControllers {
			if x := hs[c]; x != nil && (x.v2 == (parts[0] == "0")) && (x.v2 || slices.Contains(strings.Split(parts[1], ","), c)) {
				h = x
			}
		}
		if h != nil && !seen[h.dir(parts[2])] {
			seen[h.dir(parts[2])] = true
			out = append(out, h.dir(parts[2]))
		}
	}
	return out
}

// removeWhenDone removes an attached jail's cgroups after its init is
// gone (the control connection ends first; its processes a moment later).
// A jail that merely changed callers keeps them: they are not empty.
func (j *Jail) removeWhenDone(dirs []string) {
	if len(dirs) == 0 {
		return
	}
	<-j.done
	removeCgroups(dirs, 10*time.Second)
}

// SweepCgroups removes the empty cgroups of jails that ended while no
// caller was attached (an orphaned jail's timeout): at a gateway's start,
// under its own cgroups. Cgroups made in the last minute are left alone
// (a jail starting now).
func SweepCgroups() {
	seen := map[string]bool{}
	for _, h := range cgroupHosts() {
		if seen[h.base] {
			continue
		}
		seen[h.base] = true
		ents, err := os.ReadDir(h.base)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) {
				continue
			}
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				unix.Rmdir(filepath.Join(h.base, e.Name()))
			}
		}
	}
}

// setRlimits applies l's process limits to the init, whose program and
// every process after it inherit them.
func (l Limits) setRlimits() error {
	if l.FileSize <= 0 {
		return nil
	}
	v := uint64(l.FileSize)
	return unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: v, Max: v})
}
