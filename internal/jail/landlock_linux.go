package jail

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Landlock domain of its own for every filtered program (ADR 0044).
//
// Commands run as the same uid as the agent that starts them, and the
// built-in agent stays dumpable: it makes user namespaces for manual-mode
// sandboxes, which a non-dumpable process cannot (the kernel gives the
// child's /proc/<pid>/uid_map to root). A same-uid, dumpable process is
// otherwise the command's to read and write through /proc/<pid>/mem,
// environ and fd, and the agent holds a looser seccomp filter and other
// sessions' conversations. Landlock closes that whatever the uid: a
// process in a domain may trace, or open the /proc entries that need
// ptrace access of, only processes of its own domain or of domains nested
// in it. StartFiltered and the shim put each program in a new domain
// nested in its starter's, so the starter (the agent, the daemon, the
// jail's init) and every sibling command are out of its reach, while the
// starter still reaches it.
//
// The domain restricts nothing else: it handles making block and
// character devices only (which no program of a jail may do anyway), the
// one access every Landlock version knows, and grants none.

// ErrNoLandlock is what Isolate returns on a kernel without Landlock.
var ErrNoLandlock = errors.New("jail: this kernel has no Landlock (Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= list)")

var (
	landlockOnce sync.Once
	landlockABI  int
)

// LandlockABI is the kernel's Landlock version, 0 when it has none.
func LandlockABI() int {
	landlockOnce.Do(func() {
		v, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
		if errno == 0 {
			landlockABI = int(v)
		}
	})
	return landlockABI
}

// isolate puts the calling thread (and what it starts from now on) in a
// new Landlock domain nested in its current one. It needs no_new_privs.
func isolate() error {
	if LandlockABI() < 1 {
		return ErrNoLandlock
	}
	attr := unix.LandlockRulesetAttr{Access_fs: unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK | unix.LANDLOCK_ACCESS_FS_MAKE_CHAR}
	// The first version's size: the fields after it stay unknown to
	// older kernels and unused here.
	fd, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), 8, 0)
	if errno != 0 {
		return fmt.Errorf("jail: landlock ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("jail: no_new_privs: %w", err)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("jail: landlock restrict_self: %w", errno)
	}
	return nil
}
