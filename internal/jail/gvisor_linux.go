package jail

import (
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// UnderGVisor reports whether this process runs on gVisor's kernel (an
// intern of --provisioner gvisor, ADR 0981), which names itself by a fixed
// release and version that no program can change (a UTS namespace sets
// only the host and domain names).
//
// There a jail's init is not set a parent-death signal by its caller: Go's
// fork, seeing the child's getppid() differ from the caller's pid (0
// across a new PID namespace), sends the child SIGKILL, which Linux ignores
// for a PID namespace's init and gVisor delivers; the init sets it itself.
// And the seccomp filter lets syslog through: gVisor's kernel log is its
// own boot banner.
var UnderGVisor = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	// Debian's 2022 release says 4.4.0; later ones 4.19.0-gvisor (and may
	// move the number). The version string is the same in both.
	release := unix.ByteSliceToString(u.Release[:])
	return (release == "4.4.0" || strings.HasSuffix(release, "-gvisor")) &&
		unix.ByteSliceToString(u.Version[:]) == "#1 SMP Sun Jan 10 15:06:54 PST 2016"
})
