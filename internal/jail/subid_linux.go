package jail

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/spawn"
)

// A caller that is not root gets a user namespace for its jail from the
// kernel, but may map into it only its own uid: a program running as that
// uid is the caller's host user, with its files and its supplementary
// groups. So such a jail maps its program to an id of the caller's
// subordinate ranges (/etc/subuid, /etc/subgid), written by the setuid
// helpers newuidmap and newgidmap, which check the ranges are the caller's.
// The jail's root (its init, while it builds the view) stays the caller.

// subRange is a user's subordinate id range: start, start+1, …, start+count-1.
type subRange struct{ start, count int }

// subFiles are where the ranges are read (variables for tests).
var subUIDFile, subGIDFile = "/etc/subuid", "/etc/subgid"

// usesRange says whether a jail of spec runs its program as a subordinate
// id: the caller is not root, and the jail is not one inside a jail
// (Inherit), which maps its program to the outer jail's user as before.
func usesRange(spec Spec) bool {
	return os.Geteuid() != 0 && !spec.Inherit
}

// lookupRange finds the first range of the user (by name or uid) in file.
func lookupRange(file, name string, uid int) (subRange, error) {
	f, err := os.Open(file)
	if err != nil {
		return subRange{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(parts) != 3 || (parts[0] != name && parts[0] != strconv.Itoa(uid)) {
			continue
		}
		start, err1 := strconv.Atoi(parts[1])
		count, err2 := strconv.Atoi(parts[2])
		if err1 == nil && err2 == nil && start > 0 && count > 0 {
			return subRange{start, count}, nil
		}
	}
	if err := sc.Err(); err != nil {
		return subRange{}, err
	}
	return subRange{}, fmt.Errorf("no line for %s or %d in it", name, uid)
}

// callerRanges returns this process's user's subordinate uid and gid
// ranges, or an error that says how to give it some.
func callerRanges() (uids, gids subRange, err error) {
	uid := os.Geteuid()
	name := strconv.Itoa(uid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	add := fmt.Sprintf("as root, give it a range of ids no other user has (e.g. `usermod --add-subuids 1000000-1065535 --add-subgids 1000000-1065535 %s`, "+
		"or the lines `%s:1000000:65536` in /etc/subuid and /etc/subgid); or run the gateway as root", name, name)
	// The helpers first: with a range but without them, the range is not
	// what is missing.
	for _, tool := range []string{"newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(tool); err != nil {
			return subRange{}, subRange{}, fmt.Errorf("%w: %s is not installed (Debian and Ubuntu: apt-get install uidmap; Fedora: shadow-utils), "+
				"and a jail's program must not run as the gateway's own user (uid %d); or run the gateway as root", ErrSubIDs, tool, uid)
		}
	}
	file := subUIDFile
	uids, err = lookupRange(file, name, uid)
	if err == nil {
		file = subGIDFile
		gids, err = lookupRange(file, name, uid)
	}
	if err != nil {
		return subRange{}, subRange{}, fmt.Errorf("%w: the user %s (uid %d) has no subordinate range in %s (%v), and a jail's program must not run as the gateway's own user: %s",
			ErrSubIDs, name, uid, file, err, add)
	}
	return uids, gids, nil
}

// HostIDs returns the host uid and gid that spec's program runs as: the
// Spec's for a root caller; for another, the ids of its subordinate ranges
// that Spec.SubID picks.
func HostIDs(spec Spec) (uid, gid int, err error) {
	if !usesRange(spec) {
		if os.Geteuid() == 0 && !spec.UserNS {
			return spec.UID, spec.GID, nil
		}
		return os.Geteuid(), os.Getegid(), nil
	}
	uids, gids, err := callerRanges()
	if err != nil {
		return 0, 0, err
	}
	return uids.start + slot(spec.SubID, uids.count), gids.start + slot(spec.SubID, gids.count), nil
}

func slot(n, count int) int {
	if n < 0 {
		n = -n
	}
	return n % count
}

// idMaps are the uid and gid maps of a user namespace, as newuidmap and
// newgidmap take them: inside, outside, count, …
type idMaps struct{ uid, gid []string }

// programMaps maps the jail's root to the caller and ProgramUID to the
// subordinate ids of spec.
func programMaps(spec Spec) (idMaps, error) {
	uid, gid, err := HostIDs(spec)
	if err != nil {
		return idMaps{}, err
	}
	return idMaps{
		uid: []string{"0", strconv.Itoa(os.Geteuid()), "1", strconv.Itoa(ProgramUID), strconv.Itoa(uid), "1"},
		gid: []string{"0", strconv.Itoa(os.Getegid()), "1", strconv.Itoa(ProgramUID), strconv.Itoa(gid), "1"},
	}, nil
}

// rangeMaps maps the root to the caller and 1… to the whole ranges (the
// helper that owns or removes files of any program of this caller).
func rangeMaps() (idMaps, subRange, subRange, error) {
	uids, gids, err := callerRanges()
	if err != nil {
		return idMaps{}, uids, gids, err
	}
	return idMaps{
		uid: []string{"0", strconv.Itoa(os.Geteuid()), "1", "1", strconv.Itoa(uids.start), strconv.Itoa(uids.count)},
		gid: []string{"0", strconv.Itoa(os.Getegid()), "1", "1", strconv.Itoa(gids.start), strconv.Itoa(gids.count)},
	}, uids, gids, nil
}

// write sets the maps of the user namespace of pid. newgidmap leaves
// setgroups allowed (the ranges are the caller's), so the init can drop
// the caller's supplementary groups.
func (m idMaps) write(pid int) error {
	// Both at once: each is an exec of a setuid program, a few ms.
	errs := make(chan error, 2)
	for _, c := range []struct {
		tool string
		args []string
	}{{"newuidmap", m.uid}, {"newgidmap", m.gid}} {
		go func() {
			out, err := exec.Command(c.tool, append([]string{strconv.Itoa(pid)}, c.args...)...).CombinedOutput()
			if err != nil {
				err = fmt.Errorf("jail: %s %s: %v: %s", c.tool, strings.Join(c.args, " "), err, strings.TrimSpace(string(out)))
			}
			errs <- err
		}()
	}
	return errors.Join(<-errs, <-errs)
}

// ambientCaps are the capabilities a process started in a new user
// namespace keeps across its exec although its uid is not yet mapped
// (newuidmap runs once it has started): all of them, as the jail's root
// had with the maps the kernel writes before exec.
func ambientCaps() []uintptr {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	caps := make([]uintptr, 0, last+1)
	for c := 0; c <= last; c++ {
		caps = append(caps, uintptr(c))
	}
	return caps
}

// idToolArg0 makes a binary importing this package a helper that owns or
// removes files as the root of a user namespace mapping the caller's
// ranges.
const idToolArg0 = "cohort-jail-idtool"

func init() {
	if len(os.Args) == 5 && os.Args[0] == idToolArg0 {
		runIDTool(os.Args[1], os.Args[2], os.Args[3], os.Args[4])
	}
}

// runIDTool waits for its maps (stdin closes), then does op.
func runIDTool(op, path, uid, gid string) {
	io.Copy(io.Discard, os.Stdin)
	u, err1 := strconv.Atoi(uid)
	g, err2 := strconv.Atoi(gid)
	err := errors.Join(err1, err2)
	if err == nil {
		switch op {
		case "own":
			err = chownTree(path, u, g)
		case "remove":
			err = os.RemoveAll(path)
		default:
			err = fmt.Errorf("unknown operation %q", op)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// chownTree gives path and everything under it to uid:gid (symlinks
// themselves, never their targets).
func chownTree(path string, uid, gid int) error {
	return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// idTool runs the helper for op on path; uid and gid are host ids of the
// caller's ranges (or -1).
func idTool(op, path string, uid, gid int) error {
	maps, uids, gids, err := rangeMaps()
	if err != nil {
		return err
	}
	// Inside, the range's id k is 1+k-start.
	in := func(id int, r subRange) int {
		if id < 0 {
			return -1
		}
		return 1 + id - r.start
	}
	stdin, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer stdin.Close()
	defer w.Close()
	var stderr strings.Builder
	cmd := &exec.Cmd{Path: "/proc/self/exe",
		Args:   []string{idToolArg0, op, path, strconv.Itoa(in(uid, uids)), strconv.Itoa(in(gid, gids))},
		Env:    []string{},
		Stdin:  stdin,
		Stderr: &stderr,
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, AmbientCaps: ambientCaps(),
			Pdeathsig: syscall.SIGKILL},
	}
	if err := spawn.Start(cmd); err != nil { // its Pdeathsig: internal/spawn
		return fmt.Errorf("jail: %s %s: %w", op, path, err)
	}
	stdin.Close()
	if err := maps.write(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("jail: %s %s: %v: %s", op, path, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Chown gives dir and everything in it to the host uid and gid (HostIDs
// of a jail): directly for a root caller; for another, through a user
// namespace mapping its subordinate ranges (the ids must be in them).
func Chown(dir string, uid, gid int) error {
	if os.Geteuid() == 0 {
		return chownTree(dir, uid, gid)
	}
	return idTool("own", dir, uid, gid)
}

// RemoveAll removes path and everything in it, including what a jail's
// program (a subordinate id of a caller that is not root) made there, and
// the work directory of its writable bind (WorkDir).
func RemoveAll(path string) error {
	return errors.Join(removeAll(path), removeAll(WorkDir(path)))
}

func removeAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil || os.Geteuid() == 0 || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return idTool("remove", path, -1, -1)
}

// copyTree copies src to dst in the jail's root: directories every user
// may list and enter, symlinks, and regular files every user may read.
// What only an owner or a group may read is left out, so it is absent
// from the view, not merely unreadable.
func copyTree(src, dst string, optional bool) error {
	st, err := os.Lstat(src)
	if err != nil {
		if optional && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return copyEntry(src, dst, st)
}

func copyEntry(src, dst string, st fs.FileInfo) error {
	mode := st.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case mode.IsDir():
		if mode.Perm()&0o005 != 0o005 {
			return nil
		}
		if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if readableTree(src) {
			// Nothing to leave out: a read-only bind at the same path
			// costs less than copying hundreds of links.
			if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return err
			}
			return setattr(dst, true, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			info, err := e.Info()
			if err != nil {
				continue // gone meanwhile
			}
			if err := copyEntry(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), info); err != nil {
				return err
			}
		}
		return nil
	case mode.IsRegular():
		if mode.Perm()&0o004 == 0 {
			return nil
		}
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		perm := os.FileMode(0o644)
		if mode.Perm()&0o001 != 0 {
			perm = 0o755
		}
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	return nil // devices, sockets, pipes
}

// readableTree says whether every user may read everything in the
// directory dir (and list and enter every directory).
func readableTree(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return false
		}
		switch {
		case info.IsDir():
			if info.Mode().Perm()&0o005 != 0o005 || !readableTree(filepath.Join(dir, e.Name())) {
				return false
			}
		case info.Mode().IsRegular():
			if info.Mode().Perm()&0o004 == 0 {
				return false
			}
		default:
			return false // devices, sockets, pipes: copied as nothing
		}
	}
	return true
}
