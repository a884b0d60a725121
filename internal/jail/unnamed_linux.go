package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A bind mount shows in /proc/self/mountinfo the path of its source within
// its file system (the data directory, the binary's directory), whatever
// the mount point: the kernel prints the root dentry's path, and a
// detached or idmapped clone of the tree has the same root. A new file
// system has its own root: an overlay whose layers are given as
// descriptors of detached clones prints them as "/" (checked on 6.18). So
// a bind whose host path differs from its path inside is made as an
// overlay: the source's directory as its only real layer (the upper one
// for a writable bind, with a work directory beside it), an empty
// detached tmpfs as the other, and for a file, the file bound out of the
// never-attached overlay. A writable bind's upper and work directories
// must be on one mount, where their names (the intern's id) would show:
// they are given by neutral paths instead (/layers/<destination>/upper),
// which is what mountinfo prints. Still shown: a file's own name (the
// root of its mount is the file, named as on the host).

// WorkDir is where a writable bind of src keeps the overlay's work
// directory: beside it, on the same mount.
func WorkDir(src string) string {
	return filepath.Join(filepath.Dir(src), "."+filepath.Base(src)+".jail-work")
}

// bindUnnamed mounts src (under /oldroot) at dst (made already) without
// src's path in mountinfo.
func bindUnnamed(b Bind, src, dst string, dir bool) (err error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	keep := func(fd int, err error) (int, error) {
		if err == nil {
			fds = append(fds, fd)
		}
		return fd, err
	}
	tmp, err := keep(unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC))
	if err != nil {
		return err
	}
	if err := unix.FsconfigCreate(tmp); err != nil {
		return err
	}
	empty, err := keep(unix.Fsmount(tmp, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY))
	if err != nil {
		return err
	}
	ovl, err := keep(unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC))
	if err != nil {
		return err
	}
	attr := unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	if b.Writable {
		if !dir {
			return errors.New("a writable bind of a file")
		}
		work := "/oldroot" + WorkDir(b.Src)
		if err := os.Mkdir(work, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		// The upper and work directories must be on one mount, so their
		// names in it would show (a descriptor's layer is printed as its
		// path there: "upperdir=/<intern id>"). Given as a path instead,
		// a layer is printed as that path: neutral links on the scratch
		// root, gone with it, name them.
		links := filepath.Join("/layers", b.Dst)
		if err := os.MkdirAll(links, 0o700); err != nil {
			return err
		}
		defer os.RemoveAll("/layers")
		upper, wdir := filepath.Join(links, "upper"), filepath.Join(links, "work")
		if err := errors.Join(os.Symlink(src, upper), os.Symlink(work, wdir)); err != nil {
			return err
		}
		if err := errors.Join(unix.FsconfigSetFd(ovl, "lowerdir+", empty), unix.FsconfigSetString(ovl, "upperdir", upper),
			unix.FsconfigSetString(ovl, "workdir", wdir)); err != nil {
			return err
		}
	} else {
		d := src
		if !dir {
			d = filepath.Dir(src)
		}
		tree, err := keep(unix.OpenTree(unix.AT_FDCWD, d, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC))
		if err != nil {
			return err
		}
		if err := errors.Join(unix.FsconfigSetFd(ovl, "lowerdir+", tree), unix.FsconfigSetFd(ovl, "lowerdir+", empty)); err != nil {
			return err
		}
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if !initialUserNS() {
		if err := unix.FsconfigSetFlag(ovl, "userxattr"); err != nil {
			return err
		}
	}
	if err := unix.FsconfigSetString(ovl, "source", "jail"); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(ovl); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	m, err := keep(unix.Fsmount(ovl, unix.FSMOUNT_CLOEXEC, attr))
	if err != nil {
		return err
	}
	if !dir {
		if m, err = keep(unix.OpenTree(m, filepath.Base(src), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)); err != nil {
			return err
		}
	}
	return unix.MoveMount(m, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// initialUserNS says whether this process is in the host's user namespace.
func initialUserNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	return err == nil && strings.Join(strings.Fields(string(b)), " ") == "0 0 4294967295"
}
