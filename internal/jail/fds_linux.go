package jail

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// inheritedFDs lists the descriptors of 3 and up that this process
// received across exec: those without FD_CLOEXEC. Everything the Go
// runtime and standard library open has it, so whatever lacks it came from
// the process that started this one, on purpose (ExtraFiles) or not (a
// supervisor's pipe, a descriptor the caller's own parent leaked).
func inheritedFDs() ([]int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	self := int(d.Fd())
	d.Close()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd < 3 || fd == self {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		out = append(out, fd)
	}
	return out, nil
}

// closeInherited closes every inherited descriptor but keep, and marks
// those CLOEXEC: a child gets only what is passed to it explicitly.
func closeInherited(keep map[int]bool) error {
	fds, err := inheritedFDs()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if keep[fd] {
			unix.CloseOnExec(fd)
			continue
		}
		if err := unix.Close(fd); err != nil {
			return fmt.Errorf("close descriptor %d: %w", fd, err)
		}
	}
	return nil
}

// SealInherited marks every descriptor this process inherited (3 and up)
// close-on-exec, so that no child it starts gets one by accident: a child
// gets 0–2 and what is passed to it explicitly. Descriptors the process
// means to use stay open for it (it closes them after use).
func SealInherited() error {
	fds, err := inheritedFDs()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	return nil
}
